"""Our encoder with relative positions <-> Hugging Face DeBERTa-v2/v3 (`DebertaV2Model`,
`DebertaV2ForMaskedLM`): config.json and state-dict names, in pure numpy.

DeBERTa's layers are BERT's under other names; what is its own is the attention
(model/disentangled_attention.py) and the relative embedding table with its LayerNorm. The names:

    deberta.embeddings.*                               BERT's, without position_embeddings
    deberta.encoder.layer.N.attention.self.query_proj  ...attention.self.query (key, value too)
    deberta.encoder.layer.N.*                          BERT's otherwise
    deberta.encoder.rel_embeddings.weight              encoder/relative_embeddings/table
    deberta.encoder.LayerNorm.*                        encoder/relative_embeddings/norm
    lm_predictions.lm_head.dense, .LayerNorm, .bias    mlm/transform, mlm/norm, mlm/bias
    cls.predictions.*                                  the same head, config.legacy=true

So this module renames to BERT's spelling and takes the relative table aside; hf_layout converts
the rest, which keeps round trips bit-identical. DebertaV2Model has no pooler and transformers'
DebertaV2ForMaskedLM no enhanced mask decoder (it ignores mask_predictions.*): the MLM head reads
the last layer, as ours does. Exports write legacy=false (lm_predictions), whose head reads the
word embeddings themselves: nothing to tie.
"""

from __future__ import annotations

from typing import Any, Mapping

import numpy as np
from flax.core import meta

from bertjax.core.errors import UserError
from bertjax.interop import hf_bert_config, hf_layout
from bertjax.model.config import EncoderConfig

MODEL_TYPE = "deberta-v2"
ARCHITECTURES = ("DebertaV2Model", "DebertaV2ForMaskedLM")
_RELATIVE = {"rel_embeddings.weight": ("table",), "LayerNorm.weight": ("norm", "scale"),
             "LayerNorm.bias": ("norm", "bias")}
# Their spelling -> BERT's, by prefix; the longest first.
_RENAMES = (("lm_predictions.lm_head.dense.", "cls.predictions.transform.dense."),
            ("lm_predictions.lm_head.LayerNorm.", "cls.predictions.transform.LayerNorm."),
            ("lm_predictions.lm_head.bias", "cls.predictions.bias"),
            ("deberta.", "bert."))
_PROJECTIONS = {f".attention.self.{name}_proj.": f".attention.self.{name}."
                for name in ("query", "key", "value")}
# Parts a DeBERTa checkpoint lacks or may lack, by BERT-spelled prefix, in words for the report.
PARTS = {"bert.pooler.": "the pooler (no DebertaV2Model counterpart)",
         "cls.predictions.": "the MLM head (lm_predictions)",
         "cls.seq_relationship.": "the NSP head (no DeBERTa counterpart)"}
# DebertaV2Config values this encoder computes, and the words of a refusal.
_REQUIRED = {"relative_attention": (True, "relative attention"),
             "position_biased_input": (False, "no absolute positions (position_biased_input "
                                              "false, as DeBERTa-v3)"),
             "share_att_key": (True, "shared attention keys (share_att_key true)"),
             "norm_rel_ebd": ("layer_norm", "the relative embeddings' LayerNorm "
                                            "(norm_rel_ebd 'layer_norm')"),
             "conv_kernel_size": (0, "no convolution layer (conv_kernel_size 0)")}


def is_deberta(hf_config: Mapping) -> bool:
    return hf_config.get("model_type") == MODEL_TYPE


def check_architectures(hf_config: Mapping) -> None:
    for architecture in hf_config.get("architectures") or []:
        if architecture not in ARCHITECTURES:
            raise UserError(f"unsupported architecture {architecture}: bertjax reads DeBERTa-v2 "
                            f"encoders ({', '.join(ARCHITECTURES)})")


def encoder_config_from_hf(hf_config: Mapping[str, Any], **overrides) -> EncoderConfig:
    """An EncoderConfig from a DebertaV2Config config.json dict, refusing the DeBERTa options
    this encoder does not compute (v3's layout is what it computes)."""
    defaults = {"relative_attention": False, "position_biased_input": True,
                "share_att_key": False, "norm_rel_ebd": "none", "conv_kernel_size": 0}
    for key, (wanted, words) in _REQUIRED.items():
        given = hf_config.get(key, defaults[key])
        if str(given).lower() != str(wanted).lower():
            raise UserError(f"unsupported DeBERTa {key}={given!r}: bertjax computes {words}")
    attention = hf_config.get("pos_att_type") or []
    if isinstance(attention, str):
        attention = [x.strip() for x in attention.lower().split("|")]
    if sorted(attention) != ["c2p", "p2c"]:
        raise UserError(f"unsupported DeBERTa pos_att_type {attention!r}: bertjax computes both "
                        "content-to-position and position-to-content ('p2c|c2p')")
    hidden = hf_config.get("hidden_size")
    for key in ("embedding_size", "pooler_hidden_size"):
        if hf_config.get(key) not in (None, hidden):
            raise UserError(f"unsupported DeBERTa {key} {hf_config[key]} other than the hidden "
                            f"size {hidden}")
    heads = hf_config.get("num_attention_heads")
    if hf_config.get("attention_head_size") not in (None, hidden // heads if heads else None):
        raise UserError(f"unsupported DeBERTa attention_head_size "
                        f"{hf_config['attention_head_size']} other than hidden / heads")
    fields = {"pad_token_id": 0, **hf_bert_config.bert_fields(hf_config),
              "position_embedding": "relative",
              "position_buckets": max(int(hf_config.get("position_buckets", -1)), 0),
              "max_relative_positions": max(int(hf_config.get("max_relative_positions", -1)), 0)}
    try:
        return EncoderConfig(**{**fields, **overrides})
    except TypeError as e:  # an unknown override
        raise UserError(f"bad model setting: {e}") from None


def hf_config_dict(model: EncoderConfig, architecture: str) -> dict:
    """Hugging Face's `DebertaV2Config` fields for this encoder (DeBERTa-v3's layout)."""
    base = hf_bert_config.hf_config_dict(model)
    del base["position_embedding_type"]
    return {**base, "model_type": MODEL_TYPE, "architectures": [architecture],
            "dtype": model.param_dtype, "relative_attention": True,
            "position_biased_input": False, "pos_att_type": ["p2c", "c2p"],
            "share_att_key": True, "norm_rel_ebd": "layer_norm",
            "position_buckets": model.position_buckets or -1,
            "max_relative_positions": model.max_relative_positions or -1,
            "pooler_hidden_size": model.hidden_size, "legacy": False}


def to_bert_names(state_dict: Mapping[str, Any]
                  ) -> tuple[dict[str, Any], dict[str, str], dict[tuple, Any]]:
    """(the state dict in BERT's spelling without the relative table, BERT's name -> theirs,
    the relative table's arrays by their path under encoder/relative_embeddings)."""
    renamed, theirs, relative = {}, {}, {}
    for name, value in state_dict.items():
        inside = name.removeprefix("deberta.").removeprefix("encoder.")
        if name.removeprefix("deberta.").startswith("encoder.") and inside in _RELATIVE:
            relative[_RELATIVE[inside]] = value
            continue
        bert = bert_name(name)
        if bert in renamed:
            raise UserError(f"the state dict names {bert} twice ({theirs.get(bert, bert)} and "
                            f"{name})")
        renamed[bert] = value
        theirs[bert] = name
    return renamed, theirs, relative


def relative_params(relative: Mapping[tuple, Any], model: EncoderConfig) -> dict:
    """encoder/relative_embeddings from the arrays to_bert_names set aside, shapes checked."""
    expected = {("table",): (model.relative_table_size, model.hidden_size),
                ("norm", "scale"): (model.hidden_size,), ("norm", "bias"): (model.hidden_size,)}
    out: dict = {}
    for path, shape in expected.items():
        spelled = next(k for k, v in _RELATIVE.items() if v == path)
        if path not in relative:
            raise UserError(f"the weights lack deberta.encoder.{spelled}, which a DeBERTa "
                            "encoder with relative attention needs")
        value = np.asarray(relative[path]).astype(model.param_dtype)
        if value.shape != shape:
            raise UserError(f"deberta.encoder.{spelled} has shape {value.shape}, the config "
                            f"calls for {shape} (position_buckets / max_relative_positions)")
        out.setdefault(path[0], {} if len(path) > 1 else value)
        if len(path) > 1:
            out[path[0]][path[1]] = value
    return out


def from_bert_names(state_dict: Mapping[str, Any], relative: Mapping,
                    with_heads: bool) -> dict[str, Any]:
    """hf_layout's BertForPreTraining (with heads) or BertModel state dict in DeBERTa's
    spelling, the pooler and the decoder's copies left out, the relative table added."""
    back = tuple((bert, theirs) for theirs, bert in _RENAMES)
    prefix = "deberta.encoder." if with_heads else "encoder."
    out = {}
    for name, value in state_dict.items():
        if name.startswith("cls.predictions.decoder.") or "pooler." in name:
            continue
        for theirs, bert in _PROJECTIONS.items():
            name = name.replace(bert, theirs)
        out[_rename(name, back) if with_heads else name] = value
    norm = relative["norm"]
    out.update({prefix + "rel_embeddings.weight": np.asarray(relative["table"]),
                prefix + "LayerNorm.weight": np.asarray(norm["scale"]),
                prefix + "LayerNorm.bias": np.asarray(norm["bias"])})
    return out


def bert_name(name: str) -> str:
    for theirs, bert in _PROJECTIONS.items():
        name = name.replace(theirs, bert)
    return _rename(name, _RENAMES)


def their_name(bert: str) -> str:
    for theirs, ours in _PROJECTIONS.items():
        bert = bert.replace(ours, theirs)
    return _rename(bert, tuple((b, t) for t, b in _RENAMES))


def _rename(name: str, table) -> str:
    for old, new in table:
        if name.startswith(old):
            return new + name[len(old):]
    return name


def check_exportable(model: EncoderConfig) -> None:
    """Refuses a relative-position encoder with ModernBERT's layers, which DebertaV2 lacks."""
    modern = [f"model.{name}={getattr(model, name)}" for name, bert in (
        ("mlp", "gelu"), ("use_bias", True), ("norm_bias", True)) if getattr(model, name) != bert]
    if modern:
        raise UserError(f"a DeBERTa encoder with {', '.join(modern)} has no DebertaV2 "
                        "counterpart to export to; export it with --format params")


def to_hf(params: Mapping, model: EncoderConfig,
          heads: Mapping) -> tuple[dict, dict[str, np.ndarray], list[str]]:
    """(config.json, state dict, notes) of DebertaV2ForMaskedLM, or DebertaV2Model for
    parameters without the MLM head or with the enhanced mask decoder (transformers has none)."""
    check_exportable(model)
    params = meta.unbox(params)
    dropped = [words for part, words in (("nsp", "the NSP head"),
                                         ("sbo", "the span boundary head (sbo)")) if part in params]
    if "emd" in params:  # its MLM head reads the decoder, which DebertaV2ForMaskedLM lacks
        params = {part: tree for part, tree in params.items() if part not in ("mlm", "emd")}
        dropped.append("the MLM head and its enhanced mask decoder (the encoder goes out as "
                       "DebertaV2Model)")
    mlm = "mlm" in params
    notes = [f"the pooler{''.join(', ' + d for d in dropped)}: no DeBERTa counterpart, not "
             "exported"]
    relative = params["encoder"]["relative_embeddings"]
    state = hf_layout.to_hf_state_dict(params, model, nsp=False, include_heads=mlm)
    state = from_bert_names(state, relative, with_heads=mlm)
    return hf_config_dict(model, ARCHITECTURES[1 if mlm else 0]), state, notes
