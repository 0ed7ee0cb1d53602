"""Our EncoderConfig <-> a Hugging Face BERT config.json, refusing architectures this encoder does
not compute exactly."""

from __future__ import annotations

from typing import Any, Mapping

from bertjax.core.errors import UserError
from bertjax.model.config import EncoderConfig

# hidden_act -> model.activation: exact GELU, or the tanh approximation (ALBERT's "gelu_new").
_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh"}


def hf_config_dict(config: EncoderConfig) -> dict:
    """The Hugging Face `BertConfig` fields for this encoder."""
    return {
        "architectures": ["BertForPreTraining"],
        "model_type": "bert",
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_heads,
        "intermediate_size": config.intermediate_size,
        "hidden_act": "gelu_new" if config.activation == "gelu_tanh" else "gelu",
        "hidden_dropout_prob": config.hidden_dropout,
        "attention_probs_dropout_prob": config.attention_dropout,
        "max_position_embeddings": config.max_position_embeddings,
        "type_vocab_size": config.type_vocab_size,
        "initializer_range": config.initializer_range,
        "layer_norm_eps": config.layer_norm_eps,
        "pad_token_id": config.pad_token_id,
        "position_embedding_type": "absolute",
        "tie_word_embeddings": True,
    }


def encoder_config_from_hf(hf_config: Mapping[str, Any], **overrides) -> EncoderConfig:
    """An EncoderConfig from a Hugging Face config.json dict; `overrides` sets our own fields
    (dtype, param_dtype, scan_layers, remat, ...). Architectures this encoder does not compute
    exactly are user errors."""
    model_type = hf_config.get("model_type", "bert")  # Google's bert_config.json has none
    if model_type != "bert":
        raise UserError(f"unsupported model_type {model_type!r}: only 'bert' is supported")
    try:
        return EncoderConfig(**{**bert_fields(hf_config), **overrides})
    except TypeError as e:  # an unknown override
        raise UserError(f"bad model setting: {e}") from None


def bert_fields(hf_config: Mapping[str, Any]) -> dict:
    """EncoderConfig fields from the BertConfig fields of a config.json (BERT's, or RoBERTa's,
    which has the same ones), refusing what this encoder does not compute exactly."""
    position = hf_config.get("position_embedding_type", "absolute")
    if position != "absolute":
        raise UserError(f"unsupported position_embedding_type {position!r}: "
                        "only 'absolute' is supported")
    act = hf_config.get("hidden_act", "gelu")
    if act not in _ACTIVATIONS:
        raise UserError(f"unsupported hidden_act {act!r}: bertjax computes "
                        f"{', '.join(_ACTIVATIONS)}")
    if hf_config.get("is_decoder") or hf_config.get("add_cross_attention"):
        raise UserError("unsupported BERT decoder (is_decoder/add_cross_attention): "
                        "only the bidirectional encoder is supported")
    fields = dict(
        vocab_size="vocab_size", hidden_size="hidden_size", num_layers="num_hidden_layers",
        num_heads="num_attention_heads", intermediate_size="intermediate_size",
        max_position_embeddings="max_position_embeddings", type_vocab_size="type_vocab_size",
        hidden_dropout="hidden_dropout_prob", attention_dropout="attention_probs_dropout_prob",
        layer_norm_eps="layer_norm_eps", initializer_range="initializer_range",
        pad_token_id="pad_token_id")
    found = {ours: hf_config[theirs] for ours, theirs in fields.items()
             if hf_config.get(theirs) is not None}
    return {**found, **({"activation": _ACTIVATIONS[act]} if act != "gelu" else {})}
