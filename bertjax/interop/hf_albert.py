"""Our encoder with factorised embeddings or shared layers <-> Hugging Face ALBERT: config.json and
state dicts, in pure numpy.

ALBERT (Lan et al., 2020) is BERT's post-LN encoder with embedding tables of width
`embedding_size` projected to the hidden size (`albert.encoder.embedding_hidden_mapping_in`, our
embeddings/projection) and `num_hidden_groups` layers' parameters applied to
`num_hidden_layers` layers. One group is model.share_layers (our `shared_layer`); as many groups as
layers is an unshared encoder (`layers` or `layer_N`); other groupings, and more than one layer
per group (`inner_group_num`), are refused. The names, in `AlbertForPreTraining`'s spelling:

    albert.embeddings.*                                       encoder/embeddings (E wide)
    albert.encoder.embedding_hidden_mapping_in                encoder/embeddings/projection
    albert.encoder.albert_layer_groups.G.albert_layers.0.*    a layer: attention.{query,key,value,
        dense,LayerNorm}, ffn, ffn_output, full_layer_layer_norm
    albert.pooler                                             encoder/pooler (tanh)
    predictions.{dense,LayerNorm,bias}                        mlm/{transform,norm,bias}
    predictions.decoder.{weight,bias}                         tied: word embeddings, mlm/bias
    sop_classifier.classifier                                 nsp (sentence order, 2 classes)

AlbertModel writes the albert.* names without their prefix. An encoder without factorised
embeddings is exported with an identity projection, which computes the same.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import jax
import numpy as np
from flax import traverse_util
from flax.core import meta

from bertjax.core.errors import UserError
from bertjax.data.schema import zeros_batch
from bertjax.interop import hf_bert_config
from bertjax.model.config import EncoderConfig
from bertjax.model.encoder import SHARED_LAYER
from bertjax.model.heads import BertForPretraining

MODEL_TYPE = "albert"
ARCHITECTURES = ("AlbertModel", "AlbertForPreTraining", "AlbertForMaskedLM")
PARTS = {"albert.pooler.": "the pooler (albert.pooler; AlbertForMaskedLM has none)",
         "predictions.": "the MLM head (predictions)",
         "sop_classifier.": "the sentence-order head (sop_classifier)"}
_BUFFERS = ("albert.embeddings.position_ids", "albert.embeddings.token_type_ids")
_TIED = {"predictions.decoder.weight": "albert.embeddings.word_embeddings.weight",
         "predictions.decoder.bias": "predictions.bias"}

Convert = Callable[[np.ndarray, EncoderConfig], np.ndarray]
_SAME: tuple[Convert, Convert] = (lambda a, c: a, lambda a, c: a)
_LINEAR: tuple[Convert, Convert] = (lambda a, c: a.T, lambda a, c: a.T)
_HEADS_IN = (lambda a, c: a.T.reshape(c.hidden_size, c.num_heads, c.head_dim),
             lambda a, c: a.reshape(c.hidden_size, c.hidden_size).T)
_HEADS_BIAS = (lambda a, c: a.reshape(c.num_heads, c.head_dim),
               lambda a, c: a.reshape(c.hidden_size))
_HEADS_OUT = (lambda a, c: a.T.reshape(c.num_heads, c.head_dim, c.hidden_size),
              lambda a, c: a.reshape(c.hidden_size, c.hidden_size).T)


def _weight_and_bias(ours: tuple, theirs: str, weight=_LINEAR, bias=_SAME):
    return [((*ours, "kernel"), f"{theirs}.weight", weight), ((*ours, "bias"), f"{theirs}.bias", bias)]


def _norm(ours: tuple, theirs: str):
    return [((*ours, "scale"), f"{theirs}.weight", _SAME), ((*ours, "bias"), f"{theirs}.bias", _SAME)]


_LAYER = [
    *[e for p in ("query", "key", "value")
      for e in _weight_and_bias(("attention", p), f"attention.{p}", _HEADS_IN, _HEADS_BIAS)],
    *_weight_and_bias(("attention", "output"), "attention.dense", _HEADS_OUT),
    *_norm(("attention_norm",), "attention.LayerNorm"),
    *_weight_and_bias(("intermediate",), "ffn"),
    *_weight_and_bias(("output",), "ffn_output"),
    *_norm(("output_norm",), "full_layer_layer_norm"),
]
_EMBEDDINGS = [
    *[(("encoder", "embeddings", t), f"albert.embeddings.{t}.weight", _SAME)
      for t in ("word_embeddings", "position_embeddings", "token_type_embeddings")],
    *_norm(("encoder", "embeddings", "layer_norm"), "albert.embeddings.LayerNorm"),
    *_weight_and_bias(("encoder", "embeddings", "projection"),
                      "albert.encoder.embedding_hidden_mapping_in"),
]
_POOLER = _weight_and_bias(("encoder", "pooler"), "albert.pooler")
_MLM = [*_weight_and_bias(("mlm", "transform"), "predictions.dense"),
        *_norm(("mlm", "norm"), "predictions.LayerNorm"), (("mlm", "bias"), "predictions.bias", _SAME)]
_SOP = _weight_and_bias(("nsp",), "sop_classifier.classifier")


def is_albert(hf_config: Mapping) -> bool:
    return hf_config.get("model_type") == MODEL_TYPE


def exports_as_albert(model: EncoderConfig) -> bool:
    """Factorised embeddings or shared layers: ALBERT is the Hugging Face model that has them."""
    return bool(model.embedding_size or model.share_layers)


def check_architectures(hf_config: Mapping) -> None:
    for architecture in hf_config.get("architectures") or []:
        if architecture not in ARCHITECTURES:
            raise UserError(f"unsupported architecture {architecture}: bertjax reads ALBERT "
                            f"encoders ({', '.join(ARCHITECTURES)})")


def encoder_config_from_hf(hf_config: Mapping[str, Any], **overrides) -> EncoderConfig:
    layers = int(hf_config.get("num_hidden_layers", 12))
    groups = int(hf_config.get("num_hidden_groups", 1))
    if int(hf_config.get("inner_group_num", 1)) != 1:
        raise UserError(f"unsupported inner_group_num {hf_config['inner_group_num']}: bertjax "
                        "reads ALBERT encoders with one layer per group")
    if groups not in (1, layers):
        raise UserError(f"unsupported num_hidden_groups {groups} for {layers} layers: bertjax "
                        "shares one layer's parameters across all layers, or none")
    fields = {**hf_bert_config.bert_fields({"hidden_act": "gelu_new", **hf_config}),
              "embedding_size": int(hf_config.get("embedding_size", 128)),
              "share_layers": groups == 1}
    try:
        return EncoderConfig(**{**fields, **overrides})
    except TypeError as e:  # an unknown override
        raise UserError(f"bad model setting: {e}") from None


def hf_config_dict(model: EncoderConfig, architecture: str) -> dict:
    """Hugging Face's `AlbertConfig` fields for this encoder."""
    return {**hf_bert_config.hf_config_dict(model), "model_type": MODEL_TYPE,
            "architectures": [architecture], "dtype": model.param_dtype,
            "embedding_size": model.embedding_width, "inner_group_num": 1,
            "num_hidden_groups": 1 if model.share_layers else model.num_layers,
            "classifier_dropout_prob": model.hidden_dropout, "bos_token_id": 2,
            "eos_token_id": 3}


def to_hf(params: Mapping, model: EncoderConfig, heads: Mapping) -> tuple[dict, dict, list]:
    """(config.json, state dict, notes on what is left out): AlbertForPreTraining with the MLM
    and pair heads, AlbertForMaskedLM with the MLM head alone, else AlbertModel."""
    if model.positions_from_padding:
        raise UserError("an ALBERT-style encoder with RoBERTa's positions has no Hugging "
                        "Face counterpart; export it with --format params")
    params = meta.unbox(params)
    mlm, sop = "mlm" in params, "mlm" in params and "nsp" in params
    architecture = ("AlbertForPreTraining" if sop else "AlbertForMaskedLM" if mlm
                    else "AlbertModel")
    dropped = [words for part, words, gone in (
        ("pooler", "the pooler", mlm and not sop), ("sbo", "the span boundary head (sbo)", True))
        if gone and (part in params or part in params.get("encoder", {}))]
    notes = ([f"{', '.join(dropped)}: no counterpart in {architecture}, not exported"]
             if dropped else [])
    state = to_hf_state_dict(params, model, mlm=mlm, sop=sop, pooler=sop or not mlm)
    return hf_config_dict(model, architecture), state, notes


def from_hf(hf_config: Mapping, state_dict: Mapping[str, Any], scan_layers: bool
            ) -> tuple[dict, EncoderConfig, list[str], list[str]]:
    """(our params, the encoder, the parts the checkpoint lacks in words, the names not taken);
    an encoder weight missing, or one the config does not call for, is refused."""
    model = encoder_config_from_hf(hf_config, scan_layers=scan_layers)
    params, missing, unused = from_hf_state_dict(state_dict, model)
    encoder_missing = [n for n in missing if not n.startswith(tuple(PARTS))]
    if encoder_missing:
        raise UserError(f"the weights lack {len(encoder_missing)} encoder parameters the config "
                        f"calls for, e.g. {encoder_missing[0]} (does config.json describe these "
                        "weights?)")
    extra = [n for n in unused if n.removeprefix("albert.").startswith(("embeddings.", "encoder."))]
    if extra:
        raise UserError(f"the weights hold {extra[0]}, which the config does not call for: does "
                        "config.json describe these weights?")
    absent = [words for part, words in PARTS.items() if any(n.startswith(part) for n in missing)]
    return params, model, absent, unused


def _entries(model: EncoderConfig, scanned: bool, pooler: bool, mlm: bool, sop: bool):
    """(our path, HF name, converters, index into a stacked layer axis or None)."""
    for path, name, conv in _EMBEDDINGS + (_POOLER if pooler else []):
        yield path, name, conv, None
    groups = 1 if model.share_layers else model.num_layers
    for g in range(groups):
        where = SHARED_LAYER if model.share_layers else ("layers" if scanned else f"layer_{g}")
        stacked = g if scanned and not model.share_layers else None
        for path, name, conv in _LAYER:
            yield (("encoder", where, *path),
                   f"albert.encoder.albert_layer_groups.{g}.albert_layers.0.{name}", conv, stacked)
    for path, name, conv in (_MLM if mlm else []) + (_SOP if sop else []):
        yield path, name, conv, None


def to_hf_state_dict(params: Mapping, model: EncoderConfig, *, mlm: bool, sop: bool,
                     pooler: bool) -> dict[str, np.ndarray]:
    """AlbertForPreTraining / AlbertForMaskedLM names (with mlm), AlbertModel's without. The
    tied decoder copies are left out, as `save_pretrained` leaves them out."""
    flat = traverse_util.flatten_dict(meta.unbox(params))
    if not model.embedding_size:  # BERT's embeddings: the identity maps them to the layers
        eye = np.eye(model.hidden_size, dtype=np.asarray(flat[_WORDS]).dtype)
        flat[("encoder", "embeddings", "projection", "kernel")] = eye
        flat[("encoder", "embeddings", "projection", "bias")] = np.zeros_like(eye[0])
    scanned = ("encoder", "layers") in {k[:2] for k in flat}
    out = {}
    for path, name, (_, to_hf), index in _entries(model, scanned, pooler, mlm, sop):
        if path not in flat:
            raise UserError(f"the parameters have no {'/'.join(path)}")
        value = np.asarray(flat[path])
        out[name] = np.ascontiguousarray(to_hf(value if index is None else value[index], model))
    if not mlm:
        out = {name.removeprefix("albert."): value for name, value in out.items()}
    return out


_WORDS = ("encoder", "embeddings", "word_embeddings")


def from_hf_state_dict(state_dict: Mapping[str, Any], model: EncoderConfig
                       ) -> tuple[dict, list[str], list[str]]:
    """(our params, the HF names the state dict lacks, the given names not taken)."""
    given = {}
    for name, value in state_dict.items():
        key = name if name.startswith(("albert.", *PARTS)) else "albert." + name
        if key in given:
            raise UserError(f"the state dict names {key} twice (with and without 'albert.')")
        given[key] = (name, np.asarray(value.detach().float() if hasattr(value, "detach")
                                       else value))
    shapes = _shapes(model)
    found, stacks, missing, taken = {}, {}, [], set()
    for path, key, (to_ours, _), index in _entries(model, model.scan_layers, True, True, True):
        if key not in given:
            missing.append(key)
            continue
        taken.add(key)
        name, value = given[key]
        converted = _converted(to_ours, value, model)
        expected = shapes[path].shape[1:] if index is not None else shapes[path].shape
        if converted is None or converted.shape != tuple(expected):
            raise UserError(f"{name} has shape {tuple(value.shape)}, which does not fit the "
                            f"model config ({'/'.join(path)} needs {tuple(expected)})")
        converted = converted.astype(shapes[path].dtype)
        if index is None:
            found[path] = converted
        else:
            stacks.setdefault(path, {})[index] = converted
    for path, layers in stacks.items():
        if len(layers) == model.num_layers:
            found[path] = np.stack([layers[i] for i in range(model.num_layers)])
    taken |= {copy for copy, source in _TIED.items() if copy in given and source in given
              and np.array_equal(given[copy][1], given[source][1])}
    unused = sorted(name for key, (name, _) in given.items()
                    if key not in taken and not key.startswith(_BUFFERS))
    return traverse_util.unflatten_dict(found), missing, unused


def _converted(to_ours: Convert, value: np.ndarray, model: EncoderConfig) -> np.ndarray | None:
    try:
        return np.ascontiguousarray(to_ours(value, model))
    except ValueError:  # a reshape that does not fit
        return None


def _shapes(model: EncoderConfig) -> dict:
    """Our pretraining model's parameter shapes by path, traced (nothing is computed)."""
    batch = zeros_batch(1, 2, 1, nsp=True, span=False)
    tree = jax.eval_shape(lambda key: BertForPretraining(model, nsp=True).init(key, batch),
                          jax.random.key(0))
    return traverse_util.flatten_dict(meta.unbox(tree)["params"])
