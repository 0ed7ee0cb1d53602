"""Parameters without optimizer state: the params-only export format, and reading the parameters
out of a run's workdir.

    DIR/bertjax.json    {"format": "bertjax-params", "model": EncoderConfig fields, "heads": {...},
                         "source": ..., "step": ...}
    DIR/params/         an Orbax PyTree checkpoint of the parameter tree
    DIR/tokenizer/      the vocabulary the embeddings belong to (when known)

Written into a temporary directory and renamed into place, so a half-written export never exists.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from bertjax.errors import UserError
from bertjax.interop import output_dir
from bertjax.model.config import EncoderConfig

FORMAT = "bertjax-params"
INFO_FILE = "bertjax.json"
PARAMS_DIR = "params"
TOKENIZER_DIR = "tokenizer"


@dataclasses.dataclass
class ParamsBundle:
    params: dict                      # numpy arrays
    model: EncoderConfig | None       # None when the source did not record it
    heads: dict
    tokenizer_dir: str | None
    info: dict


def is_params_dir(path: str) -> bool:
    return os.path.isfile(os.path.join(path, INFO_FILE))


def is_workdir(path: str) -> bool:
    return os.path.isdir(os.path.join(path, "checkpoints"))


def save(directory: str, params: Any, model: EncoderConfig, *, heads: dict, tokenizer=None,
         info: dict | None = None, overwrite: bool = False) -> str:
    """Writes a params-only export; refuses an existing target unless `overwrite`."""
    with output_dir.staged(directory, overwrite=overwrite) as staging:
        host = jax.tree.map(np.asarray, jax.device_get(params))
        ocp.PyTreeCheckpointer().save(os.path.join(staging, PARAMS_DIR), host)
        if tokenizer is not None:
            tokenizer.save(os.path.join(staging, TOKENIZER_DIR))
        record = {"format": FORMAT, "model": dataclasses.asdict(model), "heads": heads,
                  **(info or {})}
        with open(os.path.join(staging, INFO_FILE), "w") as f:
            json.dump(record, f, indent=2)
    return os.path.abspath(directory)


def load(directory: str) -> ParamsBundle:
    with open(os.path.join(directory, INFO_FILE)) as f:
        info = json.load(f)
    if info.get("format") != FORMAT:
        raise UserError(f"{directory} is not a bertjax params export")
    params = _restore_params(os.path.join(directory, PARAMS_DIR), subtree=None)
    tokenizer_dir = os.path.join(directory, TOKENIZER_DIR)
    return ParamsBundle(params, EncoderConfig(**info["model"]), info.get("heads", {}),
                        tokenizer_dir if os.path.isdir(tokenizer_dir) else None, info)


def load_from_workdir(workdir: str, step: int | None = None) -> ParamsBundle:
    """The parameters of a run's latest (or given) checkpoint; the optimizer state stays on disk."""
    from bertjax.train.checkpoint import Checkpointer

    checkpointer = Checkpointer(workdir, read_only=True)
    steps = checkpointer.all_steps()
    if not steps:
        raise UserError(f"{workdir} has no checkpoint yet")
    step = max(steps) if step is None else step
    if step not in steps:
        raise UserError(f"{workdir} has no checkpoint of step {step} (it has {sorted(steps)})")
    params = _restore_params(os.path.join(checkpointer.directory, str(step), "state"), "params")
    run = _read_json(os.path.join(workdir, "run.json"))
    tokenizer_dir = run.get("tokenizer_dir")
    model = None
    if run.get("encoder"):
        model = EncoderConfig(**run["encoder"])
    return ParamsBundle(params, model, run.get("heads", {}),
                        tokenizer_dir if tokenizer_dir and os.path.isdir(tokenizer_dir) else None,
                        {"source": os.path.abspath(workdir), "step": step, **run})


def load_any(source: str) -> ParamsBundle:
    """A params export or a run's workdir, whichever `source` is."""
    if not os.path.exists(source):
        raise UserError(f"checkpoint not found: {source}")
    if is_params_dir(source):
        return load(source)
    if is_workdir(source):
        return load_from_workdir(source)
    raise UserError(f"{source} is neither a bertjax workdir (with checkpoints/) nor a params "
                    f"export (with {INFO_FILE})")


def recorded_model(source: str) -> tuple[EncoderConfig, str | None]:
    """(EncoderConfig, tokenizer directory or None) that a params export or a run's workdir
    records, read from its JSON alone: no arrays are loaded."""
    if not os.path.exists(source):
        raise UserError(f"checkpoint not found: {source}")
    if is_params_dir(source):
        record = _read_json(os.path.join(source, INFO_FILE))
        model, tokenizer_dir = record.get("model"), os.path.join(source, TOKENIZER_DIR)
    elif is_workdir(source):
        record = _read_json(os.path.join(source, "run.json"))
        model, tokenizer_dir = record.get("encoder"), record.get("tokenizer_dir") or ""
    else:
        raise UserError(f"{source} is neither a bertjax workdir (with checkpoints/) nor a params "
                        f"export (with {INFO_FILE})")
    if not model:
        raise UserError(f"{source} does not record its model config (no run.json?)")
    return EncoderConfig(**model), tokenizer_dir if os.path.isdir(tokenizer_dir) else None


def _restore_params(path: str, subtree: str | None) -> dict:
    checkpointer = ocp.PyTreeCheckpointer()
    try:
        metadata = checkpointer.metadata(path).item_metadata
    except Exception as e:  # a missing or unreadable checkpoint, whatever orbax raises
        raise UserError(f"cannot read the checkpoint at {path}: {e}") from None
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


def _read_json(path: str) -> dict:
    if not os.path.exists(path):
        return {}
    with open(path) as f:
        return json.load(f)
