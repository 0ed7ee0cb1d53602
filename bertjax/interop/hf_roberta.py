"""Our encoder with RoBERTa's positions <-> Hugging Face RoBERTa and XLM-RoBERTa: config.json and
state-dict names, in pure numpy.

RoBERTa is BERT's encoder under other names, with two differences that are the model's, not the
names': positions count from pad_token_id + 1 over the non-padding tokens
(model.positions_from_padding), and there is one token type. The names:

    roberta.embeddings.*, roberta.encoder.layer.N.*    BERT's (bert.*), hf_layout's layouts
    roberta.pooler.*                                   RobertaModel's; RobertaForMaskedLM has none
    lm_head.dense, lm_head.layer_norm                  mlm/transform, mlm/norm
    lm_head.bias (lm_head.decoder.bias its copy)       mlm/bias
    lm_head.decoder.weight                             tied to the word embeddings

So this module only renames between the two spellings; hf_layout converts the arrays, which
keeps round trips bit-identical. XLM-RoBERTa has the same modules under the same names; only
model_type and the class names differ.
"""

from __future__ import annotations

from typing import Any, Mapping

from bertjax.core.errors import UserError
from bertjax.interop import hf_bert_config
from bertjax.model.config import EncoderConfig

ARCHITECTURES = {"roberta": ("RobertaModel", "RobertaForMaskedLM"),
                 "xlm-roberta": ("XLMRobertaModel", "XLMRobertaForMaskedLM")}
MODEL_TYPES = tuple(ARCHITECTURES)
# Where a converted checkpoint's heads record which of the two it came from, so that an export
# gives back the same model_type and class; an encoder that does not record one is a RoBERTa.
HEADS_KEY = "hf_model_type"
# RobertaConfig's special ids (fairseq's dictionary: <s> 0, <pad> 1, </s> 2).
_PAD, _BOS, _EOS = 1, 0, 2
# Their spelling -> BERT's, by prefix; the longest prefixes first so lm_head.decoder.bias is not
# taken for lm_head.bias.
_RENAMES = (("lm_head.decoder.weight", "cls.predictions.decoder.weight"),
            ("lm_head.decoder.bias", "cls.predictions.decoder.bias"),
            ("lm_head.dense.", "cls.predictions.transform.dense."),
            ("lm_head.layer_norm.", "cls.predictions.transform.LayerNorm."),
            ("lm_head.bias", "cls.predictions.bias"),
            ("roberta.", "bert."))
# Parts a RoBERTa checkpoint may lack, by BERT-spelled prefix, in words for the report.
PARTS = {"bert.pooler.": "the pooler (roberta.pooler; RobertaForMaskedLM has none)",
         "cls.predictions.": "the MLM head (lm_head)",
         "cls.seq_relationship.": "the NSP head (no RoBERTa counterpart)"}


def is_roberta(hf_config: Mapping) -> bool:
    return hf_config.get("model_type") in MODEL_TYPES


def check_architectures(hf_config: Mapping) -> None:
    model_type = hf_config["model_type"]
    known = ARCHITECTURES[model_type]
    for architecture in hf_config.get("architectures") or []:
        if architecture not in known:
            raise UserError(f"unsupported architecture {architecture}: bertjax reads "
                            f"{model_type} encoders ({', '.join(known)})")


def encoder_config_from_hf(hf_config: Mapping[str, Any], **overrides) -> EncoderConfig:
    """An EncoderConfig from a RoBERTa / XLM-RoBERTa config.json dict; `overrides` sets our own
    fields. BERT's checks apply: they are BERT's fields."""
    fields = {"pad_token_id": _PAD, **hf_bert_config.bert_fields(hf_config)}
    try:
        return EncoderConfig(**{**fields, "positions_from_padding": True, **overrides})
    except TypeError as e:  # an unknown override
        raise UserError(f"bad model setting: {e}") from None


def hf_config_dict(model: EncoderConfig, model_type: str, architecture: str) -> dict:
    """Hugging Face's `RobertaConfig` (or `XLMRobertaConfig`) fields for this encoder."""
    if model_type not in MODEL_TYPES:
        raise UserError(f"the checkpoint records the Hugging Face model type {model_type!r}; "
                        f"RoBERTa's are {', '.join(MODEL_TYPES)}")
    return {**hf_bert_config.hf_config_dict(model), "model_type": model_type,
            "architectures": [architecture], "dtype": model.param_dtype,
            "bos_token_id": _BOS, "eos_token_id": _EOS}


def to_bert_names(state_dict: Mapping[str, Any]) -> tuple[dict[str, Any], dict[str, str]]:
    """(the state dict in BERT's spelling, BERT's name -> theirs for what was renamed)."""
    renamed, theirs = {}, {}
    for name, value in state_dict.items():
        bert = _rename(name, _RENAMES)
        if bert in renamed:
            raise UserError(f"the state dict names {bert} twice ({theirs.get(bert, bert)} and "
                            f"{name})")
        renamed[bert] = value
        theirs[bert] = name
    return renamed, theirs


def from_bert_names(state_dict: Mapping[str, Any], with_pooler: bool) -> dict[str, Any]:
    """hf_layout's BertForPreTraining / BertModel state dict in RoBERTa's spelling; the pooler
    kept only `with_pooler` (RobertaModel), as RobertaForMaskedLM has none. The decoder's copies
    of the tied weights are left out, as `save_pretrained` leaves them out: transformers ties
    them on load, and the export is then the same file a RobertaForMaskedLM writes."""
    back = tuple((bert, theirs) for theirs, bert in _RENAMES)
    prefixed = any(name.startswith("bert.") for name in state_dict)
    out = {}
    for name, value in state_dict.items():
        if name.startswith("cls.predictions.decoder."):
            continue
        if not with_pooler and name.removeprefix("bert.").startswith("pooler."):
            continue
        out[_rename(name, back) if prefixed else name] = value
    return out


def their_name(bert_name: str) -> str:
    return _rename(bert_name, tuple((bert, theirs) for theirs, bert in _RENAMES))


def _rename(name: str, table) -> str:
    for old, new in table:
        if name.startswith(old):
            return new + name[len(old):]
    return name
