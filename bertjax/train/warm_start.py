"""Starting a run from another checkpoint's parameters (`config.init_checkpoint`): any kind that
`bertjax.inference.loading` reads (a pretraining or fine-tuning workdir, a params export, a Hugging Face
directory).

Parameters are matched by '/'-joined path. Those the source lacks (a new task head) keep their
fresh initialization; those matching a `skip` pattern (regular expressions) are not loaded (heads
dropped on purpose); a shape mismatch on a loaded parameter is refused by name. Scanned and
per-layer encoder layouts load into each other. Fine-tuning loads the encoder alone and may put
the fresh initialization back into its top layers (`reinitialize_top_layers`).
"""

from __future__ import annotations

import re
import sys
from typing import Any, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from bertjax.core.errors import UserError
from bertjax.model import adaptation, layout, prompting

UNTRAINED_POOLER = "encoder/pooler"


def pooler_was_trained(heads: dict, initialized: Sequence[str] = ()) -> bool:
    """False for a checkpoint pretrained without NSP (RoBERTa, SpanBERT: nothing reads the pooled
    output, so the pooler is still its initialization, shrunk by any weight decay) or imported
    without a pooler; `heads` is the checkpoint's record, `initialized` what an import filled in."""
    if "pooler_trained" in heads:
        return bool(heads["pooler_trained"])
    if heads.get("nsp") is False:
        return False
    return not any("pooler" in part for part in initialized)


def _only(subtrees: Sequence[str]) -> tuple[str, ...]:
    """Skip patterns: everything outside `subtrees`."""
    return (rf"^(?!(?:{'|'.join(map(re.escape, subtrees))})/)",)


def _aligned(source: dict, target: dict, encoders: Sequence[str] = ("encoder",)) -> dict:
    """The source tree with its encoder layers in the target's layout."""
    for name in encoders:
        if name in source and name in target:
            scanned = layout.is_scanned(target[name])
            source = {**source, name: layout.like(source[name], scanned)}
    return source


def merge(target: Any, shardings: Any, source: dict, skip: Sequence[str] = (),
          encoders: Sequence[str] = ("encoder",)) -> tuple[Any, list[str], list[str]]:
    """(params, loaded paths, paths left as initialized). `target` is the freshly built tree."""
    patterns = [re.compile(p) for p in skip]
    flat_source = traverse_util.flatten_dict(_aligned(source, target, encoders), sep="/")
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


def load_params(source: str, source_params: dict, params: Any, shardings: Any,
                skip: Sequence[str] = ()) -> Any:
    """`params` with what `source_params` has of them (see module doc), saying what was left
    initialized."""
    merged, loaded, kept = merge(params, shardings, source_params, skip)
    if jax.process_index() == 0:
        note = f"; initialized fresh: {', '.join(_summarize(kept))}" if kept else ""
        print(f"loaded {len(loaded)} parameters from {source}{note}", file=sys.stderr)
    return merged


def load_encoder(source: str, source_params: dict, params: Any, shardings: Any,
                 reinit_top_layers: int, num_layers: int, *, trained_pooler: bool = True,
                 heads: Sequence[str] = (), encoders: Sequence[str] = ("encoder",)) -> Any:
    """`params` with the encoder of `source_params`, heads left fresh; the pooler too, when the
    source never trained it (RoBERTa's choice: the classifier then reads a fresh dense + tanh over
    [CLS] rather than a pooler that is noise). `heads` names top-level subtrees loaded as well
    (cloze keeps the pretrained MLM head, "mlm"); the caller checks that the source has them.

    Each of `encoders` (a dual encoder's "encoder" and "document_encoder") starts from the
    source's subtree of that name, or else from its "encoder"."""
    tree = {name: source_params.get(name, source_params.get("encoder")) for name in encoders}
    tree.update({name: source_params.get(name) for name in heads})
    tree = {name: subtree for name, subtree in tree.items() if subtree is not None}
    poolers = tuple(f"{name}/pooler/" for name in encoders)
    skip = _only((*encoders, *heads)) + (() if trained_pooler else tuple(f"^{p}" for p in poolers))
    merged, loaded, kept = merge(params, shardings, tree, skip, encoders)
    if not trained_pooler and jax.process_index() == 0:
        print(f"the pooler of {source} was never trained (pretrained without NSP): initialized "
              "fresh for the task head", file=sys.stderr)
    missing = [name for name in kept if name.split("/")[0] in encoders
               and not adaptation.added(name) and (trained_pooler or not name.startswith(poolers))]
    if missing:
        raise UserError(f"the init checkpoint {source} lacks encoder parameter(s) "
                        f"{', '.join(missing[:3])}: not a BERT encoder of this shape")
    if reinit_top_layers:
        if reinit_top_layers > num_layers:
            raise UserError(f"finetune.reinit_top_layers={reinit_top_layers} exceeds the "
                            f"encoder's {num_layers} layers")
        merged = reinitialize_top_layers(merged, params, shardings, reinit_top_layers,
                                         num_layers, encoders)
    if jax.process_index() == 0:
        fresh = sorted({"adapters/LoRA" if adaptation.added(n) else n.split("/")[0]
                        for n in kept})
        note = f" and the top {reinit_top_layers} layer(s) + pooler" if reinit_top_layers else ""
        what = " and ".join(["the encoder", *heads])
        fresh_note = f"; initialized fresh: {', '.join(fresh)}{note}" if fresh or note else ""
        print(f"loaded {what} ({len(loaded)} arrays) from {source}{fresh_note}",
              file=sys.stderr)
    return merged


def reinitialize_top_layers(loaded: Any, fresh: Any, shardings: Any, k: int,
                            num_layers: int, encoders: Sequence[str] = ("encoder",)) -> Any:
    """The fresh values in the top k layers and the pooler, the loaded ones elsewhere. A scanned
    encoder stacks its layers in one array per parameter: its top slices are replaced."""
    first_fresh = num_layers - k

    def pick(path, old, new):
        names = [str(getattr(key, "key", key)) for key in path]
        where = names[1] if len(names) >= 2 and names[0] in encoders else None
        if where == "pooler":
            return new
        if where == "layers":  # stacked: [num_layers, ...]
            top = jnp.arange(num_layers) >= first_fresh
            return jnp.where(top.reshape((-1,) + (1,) * (old.ndim - 1)), new, old)
        match = re.fullmatch(r"layer_(\d+)", where or "")
        return new if match and int(match.group(1)) >= first_fresh else old

    combine = jax.jit(lambda a, b: jax.tree_util.tree_map_with_path(pick, a, b),
                      out_shardings=shardings)
    return combine(loaded, fresh)


def _summarize(paths: list[str], limit: int = 6) -> list[str]:
    tops = sorted({"/".join(p.split("/")[:2]) for p in paths})
    return tops[:limit] + ([f"... ({len(tops) - limit} more)"] if len(tops) > limit else [])


def vocabulary_prompt(params, shardings, tokenizer, seed: int):
    """The soft prompt started as the loaded embeddings of sampled vocabulary words."""
    special = set(tokenizer.special.as_array().tolist())
    tokens = [tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)]
    length = params[prompting.PROMPT]["embeddings"].shape[0]
    ids = prompting.prompt_token_ids(tokens, special, length, seed)
    words = np.asarray(jax.device_get(params["encoder"]["embeddings"]["word_embeddings"]))
    vectors = jax.device_put(words[ids].astype(words.dtype),
                             shardings[prompting.PROMPT]["embeddings"])
    if jax.process_index() == 0:
        print(f"the soft prompt starts as the embeddings of {', '.join(tokenizer.tokens(ids[:8]))}"
              f"{' ...' if len(ids) > 8 else ''}", file=sys.stderr)
    return {**params, prompting.PROMPT: {"embeddings": vectors}}
