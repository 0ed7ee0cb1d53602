"""Our parameter tree <-> a Hugging Face BERT state dict, in pure numpy.

Our tree is `BertForPretraining`'s unboxed params: `encoder` (layers stacked under `layers` when
scanned, else `layer_0` ..), `mlm`, `nsp` (`sbo` has no Hugging Face counterpart and is left out).
Torch Linear weights are [out, in] (ours [in, out]); our q/k/v kernels are [H, N, D] and the
attention output kernel [N, D, H]. Conversions are transposes and reshapes only, so a round trip
is bit-identical. The config is hf_bert_config.py's; files, CLIs and tokenizers are someone else's
concern.
"""

from __future__ import annotations

import re
from typing import Any, Callable, Mapping

import ml_dtypes  # numpy has no bfloat16; jax's own dependency provides it
import numpy as np
from flax import traverse_util
from flax.core import meta

from bertjax.core.errors import UserError
from bertjax.model.config import EncoderConfig

Tree = dict[str, Any]
# (to ours, to Hugging Face): each maps an array given the config.
Converter = tuple[Callable[[np.ndarray, EncoderConfig], np.ndarray],
                  Callable[[np.ndarray, EncoderConfig], np.ndarray]]

_SAME: Converter = (lambda a, c: a, lambda a, c: a)
_LINEAR: Converter = (lambda a, c: a.T, lambda a, c: a.T)
_HEADS_IN: Converter = (lambda a, c: a.T.reshape(c.hidden_size, c.num_heads, c.head_dim),
                        lambda a, c: a.reshape(c.hidden_size, c.hidden_size).T)
_HEADS_BIAS: Converter = (lambda a, c: a.reshape(c.num_heads, c.head_dim),
                          lambda a, c: a.reshape(c.hidden_size))
_HEADS_OUT: Converter = (lambda a, c: a.T.reshape(c.num_heads, c.head_dim, c.hidden_size),
                         lambda a, c: a.reshape(c.hidden_size, c.hidden_size).T)

# (our path inside one layer, Hugging Face name after "encoder.layer.N.", converter)
_LAYER = [
    *[entry for proj in ("query", "key", "value") for entry in (
        (("attention", proj, "kernel"), f"attention.self.{proj}.weight", _HEADS_IN),
        (("attention", proj, "bias"), f"attention.self.{proj}.bias", _HEADS_BIAS))],
    (("attention", "output", "kernel"), "attention.output.dense.weight", _HEADS_OUT),
    (("attention", "output", "bias"), "attention.output.dense.bias", _SAME),
    (("attention_norm", "scale"), "attention.output.LayerNorm.weight", _SAME),
    (("attention_norm", "bias"), "attention.output.LayerNorm.bias", _SAME),
    (("intermediate", "kernel"), "intermediate.dense.weight", _LINEAR),
    (("intermediate", "bias"), "intermediate.dense.bias", _SAME),
    (("output", "kernel"), "output.dense.weight", _LINEAR),
    (("output", "bias"), "output.dense.bias", _SAME),
    (("output_norm", "scale"), "output.LayerNorm.weight", _SAME),
    (("output_norm", "bias"), "output.LayerNorm.bias", _SAME),
]
# Outside the layers: (our path, Hugging Face name in BertForPreTraining, converter).
_EMBEDDINGS_AND_POOLER = [
    (("encoder", "embeddings", "word_embeddings"), "bert.embeddings.word_embeddings.weight", _SAME),
    (("encoder", "embeddings", "position_embeddings"),
     "bert.embeddings.position_embeddings.weight", _SAME),
    (("encoder", "embeddings", "token_type_embeddings"),
     "bert.embeddings.token_type_embeddings.weight", _SAME),
    (("encoder", "embeddings", "layer_norm", "scale"), "bert.embeddings.LayerNorm.weight", _SAME),
    (("encoder", "embeddings", "layer_norm", "bias"), "bert.embeddings.LayerNorm.bias", _SAME),
    (("encoder", "pooler", "kernel"), "bert.pooler.dense.weight", _LINEAR),
    (("encoder", "pooler", "bias"), "bert.pooler.dense.bias", _SAME),
]
_MLM = [
    (("mlm", "transform", "kernel"), "cls.predictions.transform.dense.weight", _LINEAR),
    (("mlm", "transform", "bias"), "cls.predictions.transform.dense.bias", _SAME),
    (("mlm", "norm", "scale"), "cls.predictions.transform.LayerNorm.weight", _SAME),
    (("mlm", "norm", "bias"), "cls.predictions.transform.LayerNorm.bias", _SAME),
    (("mlm", "bias"), "cls.predictions.bias", _SAME),
]
_NSP = [
    (("nsp", "kernel"), "cls.seq_relationship.weight", _LINEAR),
    (("nsp", "bias"), "cls.seq_relationship.bias", _SAME),
]
# Copies of tied weights in Hugging Face's state dict, and buffers that are not weights.
_TIED = {"cls.predictions.decoder.weight": "bert.embeddings.word_embeddings.weight",
         "cls.predictions.decoder.bias": "cls.predictions.bias"}
_BUFFERS = ("bert.embeddings.position_ids", "bert.embeddings.token_type_ids")


def _layer_entries(config: EncoderConfig, scan_layers: bool):
    """(our path, HF name, converter, layer index or None if not stacked) for every layer."""
    for i in range(config.num_layers):
        for path, name, conv in _LAYER:
            ours = ("encoder", "layers", *path) if scan_layers else ("encoder", f"layer_{i}", *path)
            yield ours, f"bert.encoder.layer.{i}.{name}", conv, (i if scan_layers else None)


def _all_entries(config: EncoderConfig, scan_layers: bool, heads: bool, nsp: bool):
    # Tables the encoder does not have (rotary or relative positions, no segments) are absent.
    absent = {"position_embeddings": config.position_embedding != "learned",
              "token_type_embeddings": not config.type_vocab_size}
    yield from ((p, n, c, None) for p, n, c in _EMBEDDINGS_AND_POOLER if not absent.get(p[-1]))
    yield from _layer_entries(config, scan_layers)
    if heads:
        yield from ((p, n, c, None) for p, n, c in _MLM)
    if heads and nsp:
        yield from ((p, n, c, None) for p, n, c in _NSP)


def _lookup(tree: Mapping, path: tuple[str, ...]) -> Any:
    node = tree
    for key in path:
        if not isinstance(node, Mapping) or key not in node:
            raise UserError(f"the parameters have no {'/'.join(path)}")
        node = node[key]
    return node


def _as_model_tree(params: Mapping) -> Mapping:
    """Accepts the model's params, its variables ({"params": ...}), or a bare Encoder's."""
    params = meta.unbox(params)
    if set(params) == {"params"}:
        params = params["params"]
    if "encoder" not in params and "embeddings" in params:
        params = {"encoder": params}
    return params


def to_hf_state_dict(params: Mapping, config: EncoderConfig, *, nsp: bool = True,
                     include_heads: bool = True) -> dict[str, np.ndarray]:
    """Hugging Face names -> numpy arrays in the parameter dtype.

    With heads: `BertForPreTraining`'s layout (`bert.` prefix, `cls.*`, the tied decoder copies).
    Without: `BertModel`'s layout (no prefix), as `BertModel.save_pretrained` writes it.
    """
    params = _as_model_tree(params)
    scan_layers = "layers" in _lookup(params, ("encoder",))
    if include_heads and nsp and "nsp" not in params:
        raise UserError("the parameters have no NSP head; export them with nsp=False")
    out: dict[str, np.ndarray] = {}
    for path, name, (_, to_hf), layer in _all_entries(config, scan_layers, include_heads, nsp):
        value = np.asarray(_lookup(params, path))
        if layer is not None:
            value = value[layer]
        out[name] = np.ascontiguousarray(to_hf(value, config))
    if include_heads:
        for copy, source in _TIED.items():
            out[copy] = out[source].copy()
    else:
        out = {name.removeprefix("bert."): value for name, value in out.items()}
    return out


def _canonical(name: str) -> str:
    """A state-dict name in BertForPreTraining's spelling (`bert.` prefix, weight/bias)."""
    if not name.startswith(("bert.", "cls.")):
        name = "bert." + name
    # Checkpoints converted from the original TensorFlow BERT call LayerNorm's params gamma/beta.
    return re.sub(r"LayerNorm\.gamma$", "LayerNorm.weight",
                  re.sub(r"LayerNorm\.beta$", "LayerNorm.bias", name))


def from_hf_state_dict(state_dict: Mapping[str, Any], config: EncoderConfig, *,
                       scan_layers: bool | None = None) -> tuple[Tree, list[str], list[str]]:
    """A Hugging Face BERT state dict -> (our params, missing names, unused names).

    Accepts `BertForPreTraining` and `BertModel` layouts (names with or without `bert.`). The
    params hold what was found, cast to `config.param_dtype`; `missing` lists the expected
    Hugging Face names that were absent (e.g. the heads of a bare `BertModel`), `unused` the
    given names that were not taken (including a decoder that is not tied to the embeddings).
    `scan_layers` defaults to `config.scan_layers`.
    """
    if scan_layers is None:
        scan_layers = config.scan_layers
    given = {}
    for name, value in state_dict.items():
        key = _canonical(name)
        if key in given:
            raise UserError(f"the state dict names {key} twice (with and without 'bert.')")
        given[key] = (name, value)
    dtype = np.dtype(_numpy_dtype(config.param_dtype))
    found: dict[tuple[str, ...], np.ndarray] = {}
    stacked: dict[tuple[str, ...], list] = {}
    taken, missing = set(), []
    for path, key, (to_ours, _), layer in _all_entries(config, scan_layers, True, True):
        if key not in given:
            missing.append(key)
            continue
        taken.add(key)
        value = _checked(to_ours, given[key], config, path, dtype)
        if layer is None:
            found[path] = value
        else:
            stacked.setdefault(path, [None] * config.num_layers)[layer] = value
    for path, values in stacked.items():
        if any(v is None for v in values):
            continue  # a layer is missing: already reported, and a partial stack is no use
        found[path] = np.stack(values)
    taken |= _tied_copies(given)
    unused = [name for key, (name, _) in given.items()
              if key not in taken and not key.startswith(_BUFFERS)]
    return traverse_util.unflatten_dict(found), missing, unused


def _checked(to_ours, named_value, config: EncoderConfig, path, dtype) -> np.ndarray:
    name, value = named_value
    value = _as_numpy(value)
    try:
        converted = to_ours(value, config)
    except ValueError:
        converted = None
    expected = _expected_shape(path, config)
    if converted is None or converted.shape != expected:
        raise UserError(f"{name} has shape {tuple(value.shape)}, which does not fit the model "
                        f"config ({'/'.join(path)} needs {expected})")
    return np.ascontiguousarray(converted).astype(dtype, copy=False)


def _expected_shape(path: tuple[str, ...], config: EncoderConfig) -> tuple[int, ...]:
    """Shapes of our params per layer (no scan axis), from the config alone."""
    h, n, d, i, v = (config.hidden_size, config.num_heads, config.head_dim,
                     config.intermediate_size, config.vocab_size)
    by_suffix = {  # first match wins: attention/output before the FFN's output
        "query/kernel": (h, n, d), "key/kernel": (h, n, d), "value/kernel": (h, n, d),
        "query/bias": (n, d), "key/bias": (n, d), "value/bias": (n, d),
        "attention/output/kernel": (n, d, h), "intermediate/kernel": (h, i),
        "intermediate/bias": (i,), "output/kernel": (i, h), "word_embeddings": (v, h),
        "position_embeddings": (config.max_position_embeddings, h),
        "token_type_embeddings": (config.type_vocab_size, h), "nsp/kernel": (h, 2),
        "nsp/bias": (2,), "mlm/bias": (v,)}
    joined = "/".join(path)
    for suffix, shape in by_suffix.items():
        if joined.endswith(suffix):
            return shape
    return (h, h) if path[-1] == "kernel" else (h,)  # pooler, transform, biases, LayerNorms


def _as_numpy(value: Any) -> np.ndarray:
    """numpy arrays, jax arrays and CPU torch tensors (torch's bfloat16 has no numpy twin: it is
    widened to fp32, exactly, before the cast to the parameter dtype)."""
    if hasattr(value, "detach") and str(getattr(value, "dtype", "")) == "torch.bfloat16":
        value = value.detach().float()
    return np.asarray(value)


def _tied_copies(given: Mapping[str, tuple[str, Any]]) -> set[str]:
    """Decoder copies that equal what they are tied to are taken; untied ones stay unused."""
    taken = set()
    for copy, source in _TIED.items():
        if copy in given and source in given:
            a, b = _as_numpy(given[copy][1]), _as_numpy(given[source][1])
            if a.shape == b.shape and np.array_equal(a, b):
                taken.add(copy)
    return taken


def _numpy_dtype(name: str):
    if name == "bfloat16":
        return ml_dtypes.bfloat16
    return name
