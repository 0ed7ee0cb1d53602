"""A fine-tuned bertjax checkpoint as the Hugging Face task model of its encoder's family.

    {"head": "sequence_classification"}  -> *ForSequenceClassification (on the pooled output)
    {"head": "regression"}               -> *ForSequenceClassification, problem_type regression
    {"head": "token_classification"}     -> *ForTokenClassification (a CRF is left out)
    {"head": "question_answering"}       -> *ForQuestionAnswering (start 0, end 1)

for the families BERT (`Bert*`), ALBERT (`Albert*`), RoBERTa and XLM-RoBERTa (`Roberta*`,
`XLMRoberta*`) and DeBERTa-v2/v3 (`DebertaV2*`). Token and span heads read the sequence output:
the encoder and our output layer under the family's names. The sequence head reads our pooled
output, dense + tanh on the first token, then the classifier; each family's class computes the
same under its own names:

    BERT      bert.pooler.dense, classifier
    ALBERT    albert.pooler, classifier
    RoBERTa   classifier.dense, classifier.out_proj    (RobertaClassificationHead)
    DeBERTa   pooler.dense, classifier                 (ContextPooler, pooler_hidden_act tanh)
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
from flax.core import meta

from bertjax.core.errors import UserError
from bertjax.interop import hf_albert, hf_bert_config, hf_deberta, hf_layout, hf_roberta
from bertjax.model.config import EncoderConfig

# fine-tuning head -> (class name suffix, our output layer, whether it reads the pooled output)
HEADS = {
    "sequence_classification": ("ForSequenceClassification", "classifier", True),
    "regression": ("ForSequenceClassification", "classifier", True),
    "token_classification": ("ForTokenClassification", "classifier", False),
    "question_answering": ("ForQuestionAnswering", "qa_outputs", False),
}
# family -> (class name prefix, the pooled head's dense layer, its output layer)
FAMILIES = {
    "bert": ("Bert", "bert.pooler.dense", "classifier"),
    "albert": ("Albert", "albert.pooler", "classifier"),
    "roberta": ("Roberta", "classifier.dense", "classifier.out_proj"),
    "xlm-roberta": ("XLMRoberta", "classifier.dense", "classifier.out_proj"),
    "deberta-v2": ("DebertaV2", "pooler.dense", "classifier"),
}


def family_of(model: EncoderConfig, heads: Mapping) -> str:
    if model.position_embedding == "relative":
        hf_deberta.check_exportable(model)
        return hf_deberta.MODEL_TYPE
    if model.positions_from_padding:
        if hf_albert.exports_as_albert(model):
            raise UserError("an ALBERT-style encoder with RoBERTa's positions has no Hugging "
                            "Face counterpart; export it with --format params")
        return heads.get(hf_roberta.HEADS_KEY, "roberta")
    return "albert" if hf_albert.exports_as_albert(model) else "bert"


def to_hf(params: Mapping, model: EncoderConfig,
          heads: Mapping) -> tuple[dict, dict[str, np.ndarray], list[str]]:
    """(config.json, state dict, notes on what is left out) of the task model."""
    head = heads["head"]
    if head not in HEADS:
        raise UserError(f"cannot export the fine-tuning head {head!r} to Hugging Face; known "
                        f"heads: {', '.join(HEADS)}")
    if heads.get("prompt_length") or "soft_prompt" in params:
        raise UserError("a soft-prompt run has no Hugging Face counterpart (its prompt vectors "
                        "would be lost); export it with --format params")
    suffix, layer, pooled = HEADS[head]
    if layer not in params or "encoder" not in params:
        raise UserError(f"the {head} checkpoint has no encoder/{layer} parameters")
    params = meta.unbox(params)
    labels = labels_of(head, heads)
    kernel, bias = np.asarray(params[layer]["kernel"]), np.asarray(params[layer]["bias"])
    if kernel.shape != (model.hidden_size, len(labels)) or bias.shape != (len(labels),):
        raise UserError(f"{layer} has shapes {kernel.shape} and {bias.shape}, the run record "
                        f"says {len(labels)} outputs on {model.hidden_size} features")
    family = family_of(model, heads)
    prefix, pooler_name, output_name = FAMILIES[family]
    state, pooler = _encoder_state(params["encoder"], model, family)
    if pooled:
        if pooler is None:
            raise UserError(f"the {head} checkpoint has no encoder/pooler parameters, which "
                            "its head reads")
        state.update({f"{pooler_name}.weight": pooler[0], f"{pooler_name}.bias": pooler[1],
                      f"{output_name}.weight": np.ascontiguousarray(kernel.T),
                      f"{output_name}.bias": bias})
    else:
        state.update({f"{layer}.weight": np.ascontiguousarray(kernel.T), f"{layer}.bias": bias})
    config = _config(model, family, prefix + suffix)
    config.update(num_labels=len(labels), id2label={str(i): s for i, s in enumerate(labels)},
                  label2id={s: i for i, s in enumerate(labels)})
    if head in ("sequence_classification", "regression"):
        config["problem_type"] = ("regression" if head == "regression"
                                  else "single_label_classification")
    notes = []
    if heads.get("crf") or "crf" in params:
        notes.append(f"the CRF transition scores have no Hugging Face counterpart: "
                     f"{prefix + suffix} gets the encoder and the per-token classifier and "
                     "decodes each token by argmax, not by Viterbi as bertjax does")
    return config, state, notes


def labels_of(head: str, heads: Mapping) -> list[str]:
    if head == "question_answering":
        return ["start", "end"]
    if head == "regression":
        return [str(label) for label in heads.get("labels") or ["LABEL_0"]][:1]
    count = heads.get("num_labels")
    labels = [str(label) for label in heads.get("labels") or []]
    if not labels and count:
        labels = [f"LABEL_{i}" for i in range(int(count))]
    if not labels or (count and int(count) != len(labels)):
        raise UserError(f"the run record's heads give num_labels={count} and "
                        f"{len(labels)} labels; cannot name the {head} outputs")
    return labels


def _encoder_state(encoder: Mapping, model: EncoderConfig, family: str
                   ) -> tuple[dict[str, np.ndarray], tuple[np.ndarray, np.ndarray] | None]:
    """(the encoder under the task model's names, without the pooler; the pooler's (weight,
    bias) in Hugging Face's orientation, or None where the encoder has none)."""
    if family == "albert":
        base = hf_albert.to_hf_state_dict({"encoder": encoder}, model, mlm=False, sop=False,
                                          pooler="pooler" in encoder)  # AlbertModel's names
        pooler = [base.pop(f"pooler.{part}", None) for part in ("weight", "bias")]
        return {f"albert.{name}": value for name, value in base.items()}, _pair(pooler)
    bert = hf_layout.to_hf_state_dict({"encoder": encoder}, model, include_heads=False)
    pooler = _pair([bert.pop(f"pooler.dense.{part}", None) for part in ("weight", "bias")])
    if family == hf_deberta.MODEL_TYPE:
        named = {f"bert.{name}": value for name, value in bert.items()}
        return hf_deberta.from_bert_names(named, encoder["relative_embeddings"],
                                          with_heads=True), pooler
    base = "bert" if family == "bert" else "roberta"
    return {f"{base}.{name}": value for name, value in bert.items()}, pooler


def _pair(pooler: list) -> tuple[np.ndarray, np.ndarray] | None:
    return None if any(part is None for part in pooler) else (pooler[0], pooler[1])


def _config(model: EncoderConfig, family: str, architecture: str) -> dict:
    if family == "albert":
        return hf_albert.hf_config_dict(model, architecture)
    if family == hf_deberta.MODEL_TYPE:
        return {**hf_deberta.hf_config_dict(model, architecture), "pooler_hidden_act": "tanh",
                "pooler_hidden_size": model.hidden_size, "pooler_dropout": model.hidden_dropout}
    if family in hf_roberta.MODEL_TYPES:
        return hf_roberta.hf_config_dict(model, family, architecture)
    return {**hf_bert_config.hf_config_dict(model), "architectures": [architecture],
            "dtype": model.param_dtype}
