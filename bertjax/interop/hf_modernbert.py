"""Our ModernBERT-style encoder <-> Hugging Face ModernBert: config.json and the state dict, in
pure numpy.

    model.embeddings.tok_embeddings     encoder/embeddings/word_embeddings (tied to the decoder)
    model.embeddings.norm               encoder/embeddings/layer_norm
    model.layers.i.attn.Wqkv            attention/{query,key,value} (rows q, k, v; heads major)
    model.layers.i.attn.Wo              attention/output
    model.layers.i.attn_norm            attention_norm (layer 0 has none: ours is unused there)
    model.layers.i.mlp.Wi, mlp.Wo       intermediate (value half, then gate), output
    model.layers.i.mlp_norm             output_norm
    model.final_norm                    encoder/final_norm
    head.dense, head.norm, decoder.bias mlm/transform, mlm/norm, mlm/bias

Conversions are transposes, reshapes and concatenations only, so round trips are bit-identical.
The pooler and the NSP head have no ModernBert counterpart. Dropout sits elsewhere in ModernBert
(inside the MLP, after the attention output): ours goes out as embedding and MLP dropout.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
from flax.core import meta

from bertjax.core.errors import UserError
from bertjax.interop import hf_layout
from bertjax.model import layout
from bertjax.model.config import EncoderConfig

MODEL_TYPE = "modernbert"
ARCHITECTURES = ("ModernBertModel", "ModernBertForMaskedLM")
FULL, SLIDING = "full_attention", "sliding_attention"
MLM_PART = "the MLM head (head, decoder)"
# ModernBertConfig's defaults, for config.json files that leave a field out.
_DEFAULTS = dict(vocab_size=50368, hidden_size=768, intermediate_size=1152, num_hidden_layers=22,
                 num_attention_heads=12, max_position_embeddings=8192, initializer_range=0.02,
                 norm_eps=1e-5, norm_bias=False, attention_bias=False, mlp_bias=False,
                 classifier_bias=False, decoder_bias=True, local_attention=128,
                 global_attn_every_n_layers=3, global_rope_theta=160_000.0,
                 local_rope_theta=10_000.0, embedding_dropout=0.0, attention_dropout=0.0,
                 hidden_activation="gelu", classifier_activation="gelu", pad_token_id=50283,
                 tie_word_embeddings=True)
_QKV = ("query", "key", "value")
# EncoderConfig field -> the ModernBertConfig field that means the same.
_SAME_FIELDS = dict(vocab_size="vocab_size", hidden_size="hidden_size",
                    num_layers="num_hidden_layers", num_heads="num_attention_heads",
                    max_position_embeddings="max_position_embeddings",
                    initializer_range="initializer_range", layer_norm_eps="norm_eps",
                    norm_bias="norm_bias", use_bias="attention_bias",
                    hidden_dropout="embedding_dropout", attention_dropout="attention_dropout",
                    pad_token_id="pad_token_id")


def is_modernbert(hf_config: Mapping) -> bool:
    return hf_config.get("model_type") == MODEL_TYPE


def is_modern(model: EncoderConfig) -> bool:
    """Whether Hugging Face's BERT cannot compute this encoder (it is ModernBert's, or refused)."""
    return (model.position_embedding == "rope" or model.norm == "pre" or model.mlp == "geglu"
            or model.has_local_layers)


def hf_config_dict(model: EncoderConfig, architecture: str) -> dict:
    """Hugging Face's `ModernBertConfig` fields for this encoder; other architectures refused."""
    for name, value in dict(position_embedding="rope", norm="pre", mlp="geglu",
                            type_vocab_size=0, adapter_size=0, lora_rank=0).items():
        if getattr(model, name) != value:
            raise UserError(f"model.{name}={getattr(model, name)!r} has no Hugging Face "
                            f"counterpart: ModernBert needs {value!r}, BERT every BERT default")
    local = model.has_local_layers
    return {
        **{theirs: getattr(model, ours) for ours, theirs in _SAME_FIELDS.items()},
        "architectures": [architecture], "model_type": MODEL_TYPE, "dtype": model.param_dtype,
        "intermediate_size": model.intermediate_size // 2, "hidden_activation": "gelu",
        "classifier_activation": "gelu", "mlp_bias": model.use_bias,
        "classifier_bias": model.use_bias, "decoder_bias": True, "tie_word_embeddings": True,
        "layer_types": [FULL if model.is_global_layer(i) else SLIDING
                        for i in range(model.num_layers)],
        "local_attention": model.sliding_window if local else 0,
        "rope_parameters": {FULL: {"rope_type": "default", "rope_theta": model.rope_theta},
                            SLIDING: {"rope_type": "default",
                                      "rope_theta": model.rope_local_theta}},
        # transformers 4.x reads these instead of layer_types and rope_parameters.
        "global_attn_every_n_layers": model.global_attention_every if local else 1,
        "global_rope_theta": model.rope_theta, "local_rope_theta": model.rope_local_theta,
        # The model config knows only the padding id; the tokenizer files name the others.
        "bos_token_id": None, "eos_token_id": None, "cls_token_id": None, "sep_token_id": None,
        "mlp_dropout": model.hidden_dropout, "classifier_dropout": 0.0,
        "classifier_pooling": "cls",
    }


def encoder_config_from_hf(hf_config: Mapping[str, Any], **overrides) -> EncoderConfig:
    """An EncoderConfig from a ModernBert config.json dict; `overrides` sets our own fields.
    What this encoder does not compute exactly is refused in one line."""
    hf = {**_DEFAULTS, **{k: v for k, v in hf_config.items() if v is not None}}
    if "pad_token_id" in hf_config and hf_config["pad_token_id"] is None:
        hf["pad_token_id"] = EncoderConfig.pad_token_id  # no padding id: ours is as good
    for name in ("hidden_activation", "classifier_activation"):
        if hf[name] != "gelu":
            raise UserError(f"unsupported {name} {hf[name]!r}: only exact (erf) 'gelu'")
    if not hf["attention_bias"] == hf["mlp_bias"] == hf["classifier_bias"]:
        raise UserError(f"unsupported ModernBert biases: attention_bias={hf['attention_bias']}, "
                        f"mlp_bias={hf['mlp_bias']}, classifier_bias={hf['classifier_bias']}; "
                        "bertjax has one switch for all three")
    if not hf["decoder_bias"] or not hf["tie_word_embeddings"]:
        raise UserError("unsupported ModernBert decoder: bertjax's is tied to the word "
                        "embeddings, with a bias (decoder_bias, tie_word_embeddings true)")
    if hf.get("head_dim") not in (None, hf["hidden_size"] // max(hf["num_attention_heads"], 1)):
        raise UserError(f"unsupported head_dim {hf['head_dim']}: bertjax's heads are "
                        "hidden_size / num_attention_heads wide")
    every, window = _attention_pattern(hf)
    theta, local_theta = _rope_thetas(hf)
    fields = {ours: hf[theirs] for ours, theirs in _SAME_FIELDS.items()}
    fields.update(intermediate_size=2 * hf["intermediate_size"], type_vocab_size=0, norm="pre",
                  position_embedding="rope", rope_theta=theta, rope_local_theta=local_theta,
                  mlp="geglu", global_attention_every=every, sliding_window=window)
    try:
        return EncoderConfig(**{**fields, **overrides})
    except TypeError as e:  # an unknown override
        raise UserError(f"bad model setting: {e}") from None


def _attention_pattern(hf: Mapping) -> tuple[int, int]:
    """(global_attention_every, sliding_window) from layer_types (or, in configs written before
    they existed, global_attn_every_n_layers)."""
    count = hf["num_hidden_layers"]
    every = max(int(hf["global_attn_every_n_layers"]), 1)
    types = hf.get("layer_types") or [SLIDING if i % every else FULL for i in range(count)]
    if len(types) != count or not set(types) <= {FULL, SLIDING}:
        raise UserError(f"unsupported layer_types {types}: bertjax reads {count} of "
                        f"{FULL!r} and {SLIDING!r}")
    if SLIDING not in types:
        return 1, 0
    full = [i for i, kind in enumerate(types) if kind == FULL]
    every = full[1] if len(full) > 1 else count
    if types != [SLIDING if i % every else FULL for i in range(count)]:
        raise UserError(f"unsupported layer_types {types}: bertjax makes every n-th layer "
                        "global, layer 0 first, and the others sliding-window")
    window = hf["local_attention"]
    if window % 2:
        raise UserError(f"unsupported odd local_attention {window}: bertjax's windows are "
                        "even (a key is seen within local_attention // 2 positions)")
    return every, window


def _rope_thetas(hf: Mapping) -> tuple[float, float]:
    if hf.get("rope_scaling"):
        raise UserError(f"unsupported rope_scaling {hf['rope_scaling']}: bertjax's are plain")
    given = hf.get("rope_parameters") or {}
    thetas = []
    for kind, default in ((FULL, hf["global_rope_theta"]), (SLIDING, hf["local_rope_theta"])):
        params = dict(given.get(kind) or {})
        rope_type = params.pop("rope_type", "default")
        theta = params.pop("rope_theta", default)
        if rope_type != "default" or params:
            raise UserError(f"unsupported rope_parameters for {kind}: rope_type {rope_type!r} "
                            f"{params or ''}; only 'default' with rope_theta is supported")
        thetas.append(float(theta))
    return thetas[0], thetas[1]


def to_hf_state_dict(params: Mapping, model: EncoderConfig, *,
                     include_heads: bool = True) -> dict[str, np.ndarray]:
    """`ModernBertForMaskedLM`'s names with heads (its tied decoder.weight left out, as
    `save_pretrained` does), `ModernBertModel`'s without."""
    params = meta.unbox(params)
    params = params.get("params", params)
    encoder = layout.to_unscanned(params["encoder"])
    prefix = "model." if include_heads else ""
    out = {f"{prefix}embeddings.tok_embeddings.weight": encoder["embeddings"]["word_embeddings"]}
    out.update(_to_hf(encoder["embeddings"]["layer_norm"], f"{prefix}embeddings.norm"))
    h = model.hidden_size
    for i in range(model.num_layers):
        layer, name = encoder[f"layer_{i}"], f"{prefix}layers.{i}."
        qkv = [_to_hf(layer["attention"][p], f"{name}attn.Wqkv", h) for p in _QKV]
        out.update({key: np.concatenate([part[key] for part in qkv]) for key in qkv[0]})
        out.update(_to_hf(layer["attention"]["output"], f"{name}attn.Wo", h))
        if i:  # layer 0's attention reads the embeddings' norm directly
            out.update(_to_hf(layer["attention_norm"], f"{name}attn_norm"))
        out.update(_to_hf(layer["intermediate"], f"{name}mlp.Wi", h))
        out.update(_to_hf(layer["output"], f"{name}mlp.Wo", model.intermediate_size // 2))
        out.update(_to_hf(layer["output_norm"], f"{name}mlp_norm"))
    out.update(_to_hf(encoder["final_norm"], f"{prefix}final_norm"))
    if include_heads:
        out.update(_to_hf(params["mlm"]["transform"], "head.dense", h))
        out.update(_to_hf(params["mlm"]["norm"], "head.norm"))
        out["decoder.bias"] = params["mlm"]["bias"]
    return {name: np.ascontiguousarray(value) for name, value in out.items()}


def _to_hf(tree: Mapping, name: str, inputs: int = 0) -> dict[str, np.ndarray]:
    """A dense layer (its kernel's leading axes `inputs` wide: heads stay apart in ours) as
    torch's [out, in] weight and flat bias, or (no `inputs`) a norm."""
    out = {f"{name}.weight": (np.asarray(tree["kernel"]).reshape(inputs, -1).T if inputs
                              else np.asarray(tree["scale"]))}
    if "bias" in tree:
        out[f"{name}.bias"] = np.asarray(tree["bias"]).reshape(-1)
    return out


def from_hf_state_dict(state_dict: Mapping[str, Any], model: EncoderConfig, *,
                       scan_layers: bool | None = None) -> tuple[dict, list[str], list[str]]:
    """A ModernBert state dict (`ModernBertForMaskedLM`'s names, or `ModernBertModel`'s without
    `model.`) -> (our params in `model.param_dtype`, the parts it lacks in words, the names not
    taken). Missing encoder weights, encoder weights the config does not call for and a decoder
    that is not the word embeddings are refused; an MLM head without its weights is left out."""
    given = _canonical(state_dict)
    take = _Taker(given, model)
    h = model.hidden_size
    words = take("model.embeddings.tok_embeddings.weight", (model.vocab_size, h))
    encoder = {"embeddings": {"word_embeddings": words,
                              "layer_norm": take.norm("model.embeddings.norm")},
               **{f"layer_{i}": _layer_from_hf(take, f"model.layers.{i}.", model, i)
                  for i in range(model.num_layers)},
               "final_norm": take.norm("model.final_norm")}
    if model.scan_layers if scan_layers is None else scan_layers:
        encoder = layout.to_scanned(encoder)
    params, absent = {"encoder": encoder}, []
    if all(name in given for name in ("head.dense.weight", "head.norm.weight", "decoder.bias")):
        params["mlm"] = {"transform": take.dense("head.dense", (h, h), (h, h)),
                         "norm": take.norm("head.norm"),
                         "bias": take("decoder.bias", (model.vocab_size,))}
    else:
        absent.append(MLM_PART)
    if "decoder.weight" in given:
        name, decoder = given.pop("decoder.weight")
        if not np.array_equal(hf_layout._as_numpy(decoder).astype(words.dtype), words):
            raise UserError(f"{name} differs from the word embeddings: bertjax ties its MLM "
                            "decoder to them and cannot hold this checkpoint's")
    extra = [name for key, (name, _) in given.items() if key.startswith("model.")]
    if extra:
        raise UserError(f"the weights hold {extra[0]}, which the config does not call for "
                        f"({model.num_layers} layers): does config.json describe these weights?")
    return params, absent, sorted(name for name, _ in given.values())


def _layer_from_hf(take: "_Taker", name: str, model: EncoderConfig, index: int) -> dict:
    h, n, d = model.hidden_size, model.num_heads, model.head_dim
    half = model.intermediate_size // 2
    qkv = take.dense(f"{name}attn.Wqkv", (3 * h, h), (h, 3, n, d), out_axes=3)
    attention = {proj: {key: value[..., k, :, :] for key, value in qkv.items()}
                 for k, proj in enumerate(_QKV)}
    attention["output"] = take.dense(f"{name}attn.Wo", (h, h), (n, d, h))
    # ModernBert has no norm before layer 0's attention: ours, unused there, is the identity.
    identity = {"scale": np.ones(h, take.dtype), "bias": np.zeros(h, take.dtype)}
    return {"attention": attention,
            "attention_norm": (take.norm(f"{name}attn_norm") if index else
                               {k: identity[k] for k in take.norm_leaves}),
            "intermediate": take.dense(f"{name}mlp.Wi", (2 * half, h), (h, 2 * half)),
            "output": take.dense(f"{name}mlp.Wo", (h, half), (half, h)),
            "output_norm": take.norm(f"{name}mlp_norm")}


class _Taker:
    """Takes weights out of the state dict: in the config's shapes, our layout, our dtype."""

    def __init__(self, given: dict, model: EncoderConfig):
        self.given, self.model = given, model
        self.dtype = np.dtype(hf_layout._numpy_dtype(model.param_dtype))
        self.norm_leaves = ("scale", "bias") if model.norm_bias else ("scale",)

    def __call__(self, key: str, shape: tuple) -> np.ndarray:
        if key not in self.given:
            raise UserError(f"the weights lack {key}, which the config calls for (does "
                            "config.json describe these weights?)")
        name, value = self.given.pop(key)
        value = hf_layout._as_numpy(value)
        if value.shape != shape:
            raise UserError(f"{name} has shape {tuple(value.shape)}, which does not fit the "
                            f"model config (it needs {shape})")
        return value.astype(self.dtype, copy=False)

    def dense(self, name: str, shape: tuple, kernel_shape: tuple, out_axes: int = 1) -> dict:
        """A torch Linear [out, in] as our kernel [*in, *out] (the last `out_axes` axes) and
        bias [*out]."""
        tree = {"kernel": self(f"{name}.weight", shape).T.reshape(kernel_shape)}
        if self.model.use_bias:
            tree["bias"] = self(f"{name}.bias", shape[:1]).reshape(kernel_shape[-out_axes:])
        return tree

    def norm(self, name: str) -> dict:
        width = (self.model.hidden_size,)
        return {leaf: self(f"{name}.{'weight' if leaf == 'scale' else 'bias'}", width)
                for leaf in self.norm_leaves}


def _canonical(state_dict: Mapping[str, Any]) -> dict[str, tuple[str, Any]]:
    """canonical name (ModernBertForMaskedLM's spelling) -> (given name, value)."""
    given = {}
    for name, value in state_dict.items():
        bare = name.startswith(("embeddings.", "layers.", "final_norm."))  # ModernBertModel's
        key = "model." + name if bare else name
        if key in given:
            raise UserError(f"the state dict names {key} twice (with and without 'model.')")
        given[key] = (name, value)
    return given
