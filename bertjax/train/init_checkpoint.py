"""Starting a run from another checkpoint's parameters (a pretraining or fine-tuning workdir, or a
params export such as the Hugging Face import writes).

Parameters are matched by path. Those the source lacks (a new task head) keep their fresh
initialization; those the caller lists in `skip` (regular expressions over '/'-joined paths) are
not loaded (heads dropped on purpose, layers to re-initialize); a shape mismatch on a loaded
parameter is refused by name. Scanned and per-layer encoder layouts load into each other.
"""

from __future__ import annotations

import re
import sys
from typing import Any, Sequence

import jax
import numpy as np

from bertjax.errors import UserError
from bertjax.interop import params_dir
from bertjax.model import layout


def _flatten(tree: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(tree, dict):
        out: dict[str, Any] = {}
        for key, value in tree.items():
            out.update(_flatten(value, f"{prefix}/{key}" if prefix else str(key)))
        return out
    return {prefix: tree}


def _aligned(source: dict, target: dict) -> dict:
    """The source tree with its encoder layers in the target's layout."""
    if "encoder" in source and "encoder" in target:
        scanned = layout.is_scanned(target["encoder"])
        source = {**source, "encoder": layout.like(source["encoder"], scanned)}
    return source


def merge(target: Any, shardings: Any, source: dict, skip: Sequence[str] = ()
          ) -> tuple[Any, list[str], list[str]]:
    """(params, loaded paths, paths left as initialized). `target` is the freshly built tree."""
    patterns = [re.compile(p) for p in skip]
    flat_source = _flatten(_aligned(source, target))
    leaves, treedef = jax.tree_util.tree_flatten_with_path(target)
    flat_shardings = jax.tree_util.tree_leaves(shardings)
    loaded, kept, merged = [], [], []
    for (path, value), sharding in zip(leaves, flat_shardings):
        name = "/".join(str(getattr(k, "key", k)) for k in path)
        given = flat_source.get(name)
        if given is None or any(p.search(name) for p in patterns):
            kept.append(name)
            merged.append(value)
            continue
        if tuple(np.shape(given)) != tuple(value.shape):
            raise UserError(f"init checkpoint parameter {name} has shape {np.shape(given)}, the "
                            f"model needs {tuple(value.shape)} (another size or vocabulary?)")
        merged.append(jax.device_put(np.asarray(given).astype(value.dtype), sharding))
        loaded.append(name)
    if not loaded:
        raise UserError("the init checkpoint shares no parameter with this model")
    return jax.tree_util.tree_unflatten(treedef, merged), loaded, kept


def load_encoder_params(source: str, params: Any, shardings: Any,
                        skip: Sequence[str] = ()) -> Any:
    """Loads what `source` has of `params` (see module doc) and says what was left initialized."""
    bundle = params_dir.load_any(source)
    merged, loaded, kept = merge(params, shardings, bundle.params, skip)
    if jax.process_index() == 0:
        note = f"; initialized fresh: {', '.join(_summarize(kept))}" if kept else ""
        print(f"loaded {len(loaded)} parameters from {source}{note}", file=sys.stderr)
    return merged


def _summarize(paths: list[str], limit: int = 6) -> list[str]:
    tops = sorted({"/".join(p.split("/")[:2]) for p in paths})
    return tops[:limit] + ([f"... ({len(tops) - limit} more)"] if len(tops) > limit else [])
