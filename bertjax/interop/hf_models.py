"""Which Hugging Face model a bertjax checkpoint becomes, and which bertjax model a Hugging Face
BERT checkpoint becomes.

Export follows the checkpoint's `heads` record:
    pretraining {"nsp": true, ...}        -> BertForPreTraining (bert.*, cls.predictions,
                                             cls.seq_relationship)
    pretraining {"nsp": false, ...}       -> BertForMaskedLM (the pooler is kept for BertModel)
    parameters without heads              -> BertModel
    {"head": ...} (a fine-tuned model)    -> its family's task class (hf_finetuned): Bert*,
                                             Albert*, Roberta*, XLMRoberta*, DebertaV2*
Import takes any BERT encoder checkpoint into our `BertForPretraining` tree (encoder, mlm, nsp);
whatever the checkpoint lacks (the pretraining heads of a bare BertModel, the pooler of a
BertForMaskedLM) is initialized fresh and named. Weight names and layouts are `hf_layout`'s.

An encoder with ModernBERT's architecture (rotary positions, pre-norm, GeGLU) is exported as
ModernBertForMaskedLM (ModernBertModel without the MLM head), and a ModernBert checkpoint
imported likewise; its names, layouts and config are `hf_modernbert`'s. An encoder with
RoBERTa's positions (model.positions_from_padding) is exported as RobertaForMaskedLM or
XLMRobertaForMaskedLM (the heads record which it was converted from; RobertaModel without the MLM
head), and a RoBERTa or XLM-RoBERTa checkpoint imported likewise; `hf_roberta` renames. An encoder
with factorised embeddings or shared layers (ALBERT's options) is exported as
AlbertForPreTraining (with the pair head, as its sentence-order head), AlbertForMaskedLM or
AlbertModel, and an ALBERT checkpoint imported likewise; `hf_albert` maps the names. An
encoder with relative positions (DeBERTa) is exported as DebertaV2ForMaskedLM (DebertaV2Model)
and a deberta-v2 checkpoint imported likewise; `hf_deberta` renames and sets the table aside.
"""

from __future__ import annotations

import dataclasses
import zlib
from typing import Any, Mapping

import flax.linen as nn
import jax
import numpy as np
from flax import traverse_util

from bertjax.data.schema import zeros_batch
from bertjax.core.errors import UserError
from bertjax.interop import (hf_albert, hf_bert_config, hf_deberta, hf_finetuned, hf_layout,
                               hf_modernbert, hf_roberta)
from bertjax.model.config import EncoderConfig
from bertjax.model.heads import BertForPretraining

Tree = dict[str, Any]

BERT_ARCHITECTURES = (
    "BertModel", "BertForPreTraining", "BertForMaskedLM", "BertForNextSentencePrediction",
    "BertForSequenceClassification", "BertForTokenClassification", "BertForQuestionAnswering",
    "BertForMultipleChoice")
# Hugging Face name prefixes of parts that may be absent, in words for the report.
_PARTS = {"bert.pooler.": "the pooler (bert.pooler)",
          "cls.predictions.": "the MLM head (cls.predictions)",
          "cls.seq_relationship.": "the NSP head (cls.seq_relationship)"}
_ENCODER_PREFIXES = ("bert.", "embeddings.", "encoder.", "pooler.")


@dataclasses.dataclass
class HFModel:
    config: dict                      # config.json
    state_dict: dict[str, np.ndarray]
    notes: list[str]                  # what does not carry over to Hugging Face


def to_hf(params: Mapping, model: EncoderConfig, heads: Mapping) -> HFModel:
    """A bertjax checkpoint's parameters as the Hugging Face model its heads call for."""
    relative = model.position_embedding == "relative"  # DeBERTa: hf_deberta's names and config
    if heads.get("head") and (relative or not hf_modernbert.is_modern(model)):
        return HFModel(*hf_finetuned.to_hf(params, model, heads))
    if relative:
        return HFModel(*hf_deberta.to_hf(params, model, heads))
    if hf_modernbert.is_modern(model):
        return _modernbert_to_hf(params, model, heads)
    if hf_albert.exports_as_albert(model):
        return _albert_to_hf(params, model, heads)
    if model.positions_from_padding:
        return _roberta_to_hf(params, model, heads)
    return _pretraining_to_hf(params, model, heads)


def _base_config(model: EncoderConfig, architecture: str) -> dict:
    return {**hf_bert_config.hf_config_dict(model), "architectures": [architecture],
            "dtype": model.param_dtype}


def _pretraining_to_hf(params: Mapping, model: EncoderConfig, heads: Mapping) -> HFModel:
    notes = []
    if "sbo" in params:
        notes.append("the span boundary head (sbo) has no Hugging Face counterpart and is not "
                     "exported")
    if "mlm" not in params:
        state = hf_layout.to_hf_state_dict(params, model, include_heads=False)
        return HFModel(_base_config(model, "BertModel"), state, notes)
    nsp = bool(heads.get("nsp", "nsp" in params)) and "nsp" in params
    state = hf_layout.to_hf_state_dict(params, model, nsp=nsp)
    if not nsp:
        notes.append("no NSP head: exported as BertForMaskedLM, whose load report lists the "
                     "pooler (kept for BertModel and sequence classification) as unexpected; "
                     "BertForPreTraining would initialize cls.seq_relationship randomly")
    return HFModel(_base_config(model, "BertForPreTraining" if nsp else "BertForMaskedLM"),
                   state, notes)


def _modernbert_to_hf(params: Mapping, model: EncoderConfig, heads: Mapping) -> HFModel:
    if heads.get("head"):
        raise UserError(f"cannot export a fine-tuned ModernBERT-style model to Hugging Face: "
                        f"ModernBert's {heads['head']} classes put their own head on the encoder "
                        "(dense, GELU, norm), which bertjax's does not compute; export it with "
                        "--format params")
    params = nn.meta.unbox(params)
    dropped = [words for part, words in (("pooler", "the pooler"), ("nsp", "the NSP head"),
                                         ("sbo", "the span boundary head (sbo)"))
               if part in params or part in params.get("encoder", {})]
    notes = [f"{', '.join(dropped)}: no ModernBert counterpart, not exported"] if dropped else []
    architecture = "ModernBertForMaskedLM" if "mlm" in params else "ModernBertModel"
    state = hf_modernbert.to_hf_state_dict(params, model, include_heads="mlm" in params)
    return HFModel(hf_modernbert.hf_config_dict(model, architecture), state, notes)


def _albert_to_hf(params: Mapping, model: EncoderConfig, heads: Mapping) -> HFModel:
    return HFModel(*hf_albert.to_hf(params, model, heads))


def _roberta_to_hf(params: Mapping, model: EncoderConfig, heads: Mapping) -> HFModel:
    model_type = heads.get(hf_roberta.HEADS_KEY, "roberta")
    params = nn.meta.unbox(params)
    mlm = "mlm" in params
    dropped = [words for part, words in (("nsp", "the NSP head"),
                                         ("sbo", "the span boundary head (sbo)")) if part in params]
    if mlm:  # RobertaForMaskedLM has no pooler
        dropped.insert(0, "the pooler")
    notes = [f"{', '.join(dropped)}: no counterpart in {model_type}'s "
             f"{'masked LM' if mlm else 'model'}, not exported"] if dropped else []
    state = hf_layout.to_hf_state_dict(params, model, nsp=False, include_heads=mlm)
    state = hf_roberta.from_bert_names(state, with_pooler=not mlm)
    architecture = hf_roberta.ARCHITECTURES[model_type][1 if mlm else 0]
    return HFModel(hf_roberta.hf_config_dict(model, model_type, architecture), state, notes)


@dataclasses.dataclass
class Imported:
    params: Tree                      # BertForPretraining(model, nsp=True) params, numpy
    model: EncoderConfig
    initialized: list[str]            # parts the checkpoint lacked, initialized fresh (words)
    not_imported: list[str]           # checkpoint names with no counterpart here


def check_architecture(hf_config: Mapping) -> None:
    """Refuses, by name, any model type or architecture that is not a BERT (or ModernBert)
    encoder: the model type first, which names the family (an architecture judged against the
    wrong family's list would name the wrong thing)."""
    model_type = hf_config.get("model_type", "bert")  # Google's bert_config.json has none
    if model_type not in ("bert", hf_modernbert.MODEL_TYPE, *hf_roberta.MODEL_TYPES,
                          hf_albert.MODEL_TYPE, hf_deberta.MODEL_TYPE):
        raise UserError(f"unsupported model_type {model_type!r}: bertjax reads BERT "
                        f"(model_type 'bert'), ModernBERT ('{hf_modernbert.MODEL_TYPE}'), "
                        "RoBERTa ('roberta'), XLM-RoBERTa ('xlm-roberta'), ALBERT ('albert') and "
                        f"DeBERTa-v2/v3 ('{hf_deberta.MODEL_TYPE}') encoders")
    if hf_deberta.is_deberta(hf_config):
        return hf_deberta.check_architectures(hf_config)
    if hf_roberta.is_roberta(hf_config):
        return hf_roberta.check_architectures(hf_config)
    if hf_albert.is_albert(hf_config):
        return hf_albert.check_architectures(hf_config)
    modern = hf_modernbert.is_modernbert(hf_config)
    known = hf_modernbert.ARCHITECTURES if modern else BERT_ARCHITECTURES
    for architecture in hf_config.get("architectures") or []:
        if architecture not in known:
            raise UserError(f"unsupported architecture {architecture}: bertjax reads "
                            f"{'ModernBert' if modern else 'BERT'} encoders ({', '.join(known)})")


def from_hf(hf_config: Mapping, state_dict: Mapping[str, Any], *, scan_layers: bool = True,
            seed: int = 0) -> Imported:
    """A Hugging Face BERT config and state dict as our pretraining model's parameters."""
    check_architecture(hf_config)
    if hf_modernbert.is_modernbert(hf_config):
        return _modernbert_from_hf(hf_config, state_dict, scan_layers, seed)
    if hf_albert.is_albert(hf_config):
        return _albert_from_hf(hf_config, state_dict, scan_layers, seed)
    model = encoder_config_from_hf(hf_config, scan_layers=scan_layers)
    parts, name, theirs = _PARTS, str, {}  # how the report spells a part and a weight
    relative = None  # DeBERTa's relative embedding table, not BERT's to name
    if hf_roberta.is_roberta(hf_config):  # BERT's weights under other names
        state_dict, theirs = hf_roberta.to_bert_names(state_dict)
        parts, name = hf_roberta.PARTS, hf_roberta.their_name
    elif hf_deberta.is_deberta(hf_config):
        state_dict, theirs, relative = hf_deberta.to_bert_names(state_dict)
        parts, name = hf_deberta.PARTS, hf_deberta.their_name
    params, missing, unused = hf_layout.from_hf_state_dict(state_dict, model)
    unused = [theirs.get(n, n) for n in unused]
    absent_parts = [part for part in parts if any(n.startswith(part) for n in missing)]
    encoder_missing = [n for n in missing if not n.startswith(tuple(parts))]
    if encoder_missing:
        raise UserError(f"the weights lack {len(encoder_missing)} encoder parameters the config "
                        f"calls for, e.g. {name(encoder_missing[0])} (does config.json describe "
                        "these weights?)")
    extra_encoder = [n for n in unused if n.startswith((*_ENCODER_PREFIXES, "roberta."))]
    if extra_encoder:
        raise UserError(f"the weights hold {extra_encoder[0]}, which the config does not call "
                        f"for ({model.num_layers} layers): does config.json describe these "
                        "weights?")
    if relative is not None:
        params["encoder"]["relative_embeddings"] = hf_deberta.relative_params(relative, model)
    if absent_parts:
        params = _fill_in(params, model, seed)
    return Imported(params, model, [parts[p] for p in absent_parts], sorted(unused))


def encoder_config_from_hf(hf_config: Mapping, **overrides) -> EncoderConfig:
    """The encoder a Hugging Face config.json describes (BERT's, RoBERTa's or ModernBert's)."""
    if hf_modernbert.is_modernbert(hf_config):
        return hf_modernbert.encoder_config_from_hf(hf_config, **overrides)
    if hf_roberta.is_roberta(hf_config):
        return hf_roberta.encoder_config_from_hf(hf_config, **overrides)
    if hf_albert.is_albert(hf_config):
        return hf_albert.encoder_config_from_hf(hf_config, **overrides)
    if hf_deberta.is_deberta(hf_config):
        return hf_deberta.encoder_config_from_hf(hf_config, **overrides)
    return hf_bert_config.encoder_config_from_hf(hf_config, **overrides)


def _modernbert_from_hf(hf_config: Mapping, state_dict: Mapping[str, Any], scan_layers: bool,
                        seed: int) -> Imported:
    model = hf_modernbert.encoder_config_from_hf(hf_config, scan_layers=scan_layers)
    params, absent, unused = hf_modernbert.from_hf_state_dict(state_dict, model)
    # The pooler and the NSP head have no ModernBert counterpart: always initialized fresh.
    absent += ["the pooler (no ModernBert counterpart)",
               "the NSP head (no ModernBert counterpart)"]
    return Imported(_fill_in(params, model, seed), model, absent, unused)


def _albert_from_hf(hf_config: Mapping, state_dict: Mapping[str, Any], scan_layers: bool,
                    seed: int) -> Imported:
    params, model, absent, unused = hf_albert.from_hf(hf_config, state_dict, scan_layers)
    return Imported(_fill_in(params, model, seed) if absent else params, model, absent, unused)


def _fill_in(params: Tree, model: EncoderConfig, seed: int) -> Tree:
    """`params` completed with BERT's initialization of the parameters it lacks: kernels normal
    (initializer_range), biases zero, LayerNorm scales one. Drawn on the host from the traced
    shapes: compiling the model's init would cost more than the whole import (seconds to tens of
    seconds on a CPU) for a few arrays. Only what is missing is drawn, each parameter from its
    own stream (the seed and its path): a real model's 12M-entry word embeddings are not drawn
    to be thrown away, and what one parameter gets does not depend on which others were given."""
    # The parameters' shapes do not depend on the batch's: the smallest one will do.
    batch = zeros_batch(1, 2, 1, nsp=True, span=False)
    shapes = nn.meta.unbox(jax.eval_shape(
        lambda key: BertForPretraining(model, nsp=True).init(key, batch),
        jax.random.key(seed))["params"])
    given = traverse_util.flatten_dict(params)

    def initial(path, leaf):
        names = tuple(str(getattr(part, "key", part)) for part in path)
        if names in given:
            return given[names]
        if names[-1] == "scale":
            return np.ones(leaf.shape, leaf.dtype)
        if names[-1] == "bias":
            return np.zeros(leaf.shape, leaf.dtype)
        rng = np.random.default_rng([seed, zlib.crc32("/".join(names).encode())])
        return (model.initializer_range * rng.standard_normal(leaf.shape)).astype(leaf.dtype)

    return jax.tree_util.tree_map_with_path(initial, shapes)

