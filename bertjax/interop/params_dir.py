"""Parameters without optimizer state: the params-only export format (read by `bertjax.inference.loading`).

    DIR/bertjax.json    {"format": "bertjax-params", "model": EncoderConfig fields, "heads": {...},
                         "source": ..., "step": ...}
    DIR/params/         an Orbax PyTree checkpoint of the parameter tree
    DIR/tokenizer/      the vocabulary the embeddings belong to (when known)

Written into a temporary directory and renamed into place, so a half-written export never exists.
"""

from __future__ import annotations

import json
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from bertjax.core.errors import UserError
from bertjax.core import output_dir
from bertjax.model.config import EncoderConfig

FORMAT = "bertjax-params"
INFO_FILE = "bertjax.json"
PARAMS_DIR = "params"
TOKENIZER_DIR = "tokenizer"


def is_params_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, INFO_FILE))


def is_model_export(path: str) -> bool:
    """A params-only or adapters export (bertjax.json) or a Hugging Face one (config.json)."""
    return is_params_dir(path) or os.path.isfile(os.path.join(path, "config.json"))


# What `export` and `convert` write, and so the only thing their --overwrite replaces.
MODEL_EXPORT = output_dir.Kind("model export (bertjax.json or config.json)", directory=True,
                               holds=is_model_export)


def save(directory: str, params: Any, model: EncoderConfig, *, heads: dict, tokenizer=None,
         info: dict | None = None, overwrite: bool = False, sources: tuple = ()) -> str:
    """Writes a params-only export; refuses an existing target unless `overwrite` (and then one
    that is not a model export), and a target that is one of `sources`."""
    with output_dir.staged(directory, overwrite=overwrite, kind=MODEL_EXPORT,
                           sources=sources) as staging:
        host = jax.tree.map(np.asarray, jax.device_get(params))
        ocp.PyTreeCheckpointer().save(os.path.join(staging, PARAMS_DIR), host)
        if tokenizer is not None:
            tokenizer.save(os.path.join(staging, TOKENIZER_DIR))
        record = {"format": FORMAT, "model": model.record(), "heads": heads,
                  **(info or {})}
        with open(os.path.join(staging, INFO_FILE), "w") as f:
            json.dump(record, f, indent=2)
    return os.path.abspath(directory)


def read_tree(path: str, subtree: str | None = None) -> dict:
    """An Orbax PyTree checkpoint (or its `subtree`) as numpy arrays; a missing, truncated or
    otherwise damaged one is refused in one line."""
    path = os.path.abspath(path)  # Orbax refuses a relative path (`bertjax.load("minilm")`)
    checkpointer = ocp.PyTreeCheckpointer()
    try:
        metadata = checkpointer.metadata(path).item_metadata
        tree = getattr(metadata, "tree", metadata)
        wanted = tree[subtree] if subtree else tree
        as_numpy = jax.tree.map(lambda _: ocp.RestoreArgs(restore_type=np.ndarray), wanted)
        target = jax.tree.map(lambda m: np.zeros(m.shape, m.dtype), wanted)
        if subtree:
            restored = checkpointer.restore(path, args=ocp.args.PyTreeRestore(
                item={subtree: target}, restore_args={subtree: as_numpy}, partial_restore=True))
            return restored[subtree]
        return checkpointer.restore(path, args=ocp.args.PyTreeRestore(item=target,
                                                                      restore_args=as_numpy))
    except Exception as e:  # whatever Orbax or tensorstore raise for a damaged checkpoint
        reason = " ".join(str(e).split())[:200] or type(e).__name__
        raise UserError(f"cannot read the checkpoint at {path}: {reason}") from None
    finally:
        checkpointer.close()
