"""The adapters export: what an adapter or LoRA run trained, without the frozen base it adapts.

    DIR/bertjax.json    {"format": "bertjax-adapters", "model": EncoderConfig fields (adapters /
                         LoRA included), "heads", "method": {"name", "fresh"}, "task", "step",
                         "source", "base": {"path": the init checkpoint,
                                            "fingerprint": sha256 of the base weights used}}
    DIR/params/         the trained parameters only: adapters or LoRA updates (the adapter method
                        also the LayerNorms), the task head, any encoder part initialized fresh
    DIR/tokenizer/      the vocabulary

`combine` puts them back on the base's encoder (read by `bertjax.inference.loading` like any model: the
base is the recorded path unless another is named) and refuses a base whose weights are not, bit
for bit, those the run was trained on: the frozen weights of the run itself fingerprint the base.
"""

from __future__ import annotations

import hashlib
from typing import Any, Mapping

import jax.numpy as jnp
import numpy as np
from flax import traverse_util

from bertjax.core.errors import UserError
from bertjax.interop import params_dir
from bertjax.model import adaptation, layout
from bertjax.model.config import EncoderConfig

FORMAT = "bertjax-adapters"


def is_adapted(model: EncoderConfig) -> bool:
    return bool(model.adapter_size or model.lora_rank)


def _flat(tree: Mapping) -> dict[str, Any]:
    return traverse_util.flatten_dict(dict(tree), sep="/")


def trained_names(params: Mapping, method: Mapping) -> set[str]:
    """The parameters `method` (run.json's {"name", "fresh"}) trained."""
    return {name for name in _flat(params)
            if adaptation.trains(name, method["name"], tuple(method.get("fresh", ())))}


def fingerprint(encoder: Mapping, exclude: set[str]) -> str:
    """sha256 of the encoder's arrays (names, dtypes, shapes, bytes) but `exclude`'s."""
    digest = hashlib.sha256()
    for name, value in sorted(_flat({"encoder": encoder}).items()):
        if name in exclude:
            continue
        value = np.ascontiguousarray(value)
        digest.update(f"{name}:{value.dtype.str}:{value.shape};".encode())
        digest.update(value.tobytes())
    return digest.hexdigest()


def save(directory: str, params: Mapping, model: EncoderConfig, *, heads: dict, method: dict,
         base: str, tokenizer=None, info: dict | None = None, overwrite: bool = False,
         sources: tuple = ()) -> str:
    """Writes the export of a run's `params` (the whole tree: the base part is left out here)."""
    names = trained_names(params, method)
    flat = _flat(params)
    own = traverse_util.unflatten_dict({tuple(n.split("/")): flat[n] for n in names})
    record = {**(info or {}), "format": FORMAT, "method": dict(method),
              "base": {"path": base, "fingerprint": fingerprint(params["encoder"], names)}}
    # params_dir writes the files; the record's "format" replaces its own.
    return params_dir.save(directory, own, model, heads=heads, tokenizer=tokenizer, info=record,
                           overwrite=overwrite, sources=sources)


def combine(own: Mapping, base_params: Mapping, model: EncoderConfig, record: Mapping,
            base: str) -> dict:
    """The whole parameter tree: the base's encoder (in this model's layout and dtype) under the
    export's own parameters; a base other than the one trained on is refused."""
    if "encoder" not in base_params:
        raise UserError(f"the base {base} has no encoder parameters")
    # As the warm start did: the layout and parameter dtype of the model trained.
    dtype = jnp.dtype(model.param_dtype)
    encoder = {k: np.asarray(v).astype(dtype) for k, v in _flat(
        {"encoder": layout.like(base_params["encoder"], model.scan_layers)}).items()}
    mine = _flat(own)
    base_encoder = traverse_util.unflatten_dict(
        {tuple(k.split("/"))[1:]: v for k, v in encoder.items()})
    if fingerprint(base_encoder, set(mine)) != record.get("base", {}).get("fingerprint"):
        raise UserError(f"the base {base} is not the one these adapters were trained on (its "
                        "weights differ from the recorded fingerprint); pass the original base")
    return traverse_util.unflatten_dict(
        {tuple(k.split("/")): v for k, v in {**encoder, **mine}.items()})
