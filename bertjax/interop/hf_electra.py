"""An ELECTRA pretraining checkpoint as Hugging Face's two ELECTRA models.

    discriminator   ElectraForPreTraining: electra.* (embeddings, layers; no pooler),
                    discriminator_predictions.{dense, dense_prediction}
    generator       ElectraForMaskedLM: electra.* with the SAME embeddings (shared in training),
                    electra.embeddings_project when its width differs from theirs,
                    generator_predictions.{dense, LayerNorm}, generator_lm_head (tied + bias)

Under GDES (bertjax/model/gdes.py) the checkpoint is read through `gdes.discriminator_view`: the
discriminator's word table is E_G + E_Δ and the generator's the shared E_G.

The layers' names and layouts are BERT's (`hf_layout`); each model's config.json carries
`embedding_size`, the discriminator's hidden size, which both embed with. The discriminator's
pooler has no ELECTRA counterpart (nothing trained it) and is left out.

A DeBERTa discriminator (DeBERTa-v3's replaced token detection) is exported as DebertaV2Model,
what fine-tuning starts from; transformers has no DeBERTa RTD class, and the generator, whose
projection of the shared embeddings follows their norm as ELECTRA's does, has no DebertaV2
counterpart (DebertaV2's embed_proj precedes it).
"""

from __future__ import annotations

from typing import Mapping

import numpy as np
from flax.core import meta

from bertjax.core.errors import UserError
from bertjax.interop import hf_albert, hf_bert_config, hf_deberta, hf_layout, hf_modernbert
from bertjax.interop.hf_models import HFModel
from bertjax.model import gdes
from bertjax.model.config import EncoderConfig

GENERATOR_DIR = "generator"  # inside the export: OUT is the discriminator, OUT/generator this


def is_electra(heads: Mapping) -> bool:
    return bool(heads.get("electra"))


def generator_config(heads: Mapping) -> EncoderConfig:
    try:
        return EncoderConfig(**heads["electra"]["generator"])
    except (KeyError, TypeError) as e:
        raise UserError(f"the run record's ELECTRA generator is unreadable: {e}") from None


def electra_config(model: EncoderConfig, embedding_size: int, architecture: str) -> dict:
    """Hugging Face's `ElectraConfig` fields: BERT's, with the embedding width apart."""
    config = hf_bert_config.hf_config_dict(model)
    config.update(model_type="electra", architectures=[architecture],
                  embedding_size=embedding_size, dtype=model.param_dtype)
    return config


def _encoder_state(encoder_tree: Mapping, model: EncoderConfig) -> dict[str, np.ndarray]:
    """`electra.*` names of embeddings and layers (BertModel's, less the pooler)."""
    tree = dict(encoder_tree)
    # hf_layout writes a BertModel, which has a pooler; ELECTRA has none, so a stand-in is
    # converted and dropped.
    tree.setdefault("pooler", {"kernel": np.zeros((1, 1)), "bias": np.zeros(1)})
    state = hf_layout.to_hf_state_dict({"encoder": tree}, model, include_heads=False)
    return {f"electra.{name}": value for name, value in state.items()
            if not name.startswith("pooler.")}


def _linear(tree: Mapping, prefix: str) -> dict[str, np.ndarray]:
    return {f"{prefix}.weight": np.ascontiguousarray(np.asarray(tree["kernel"]).T),
            f"{prefix}.bias": np.asarray(tree["bias"])}


def to_hf(params: Mapping, model: EncoderConfig, heads: Mapping) -> dict[str, HFModel]:
    """{"": the discriminator, GENERATOR_DIR: the generator}."""
    if hf_modernbert.is_modern(model):
        raise UserError("transformers' ELECTRA is BERT's encoder: an ELECTRA run on ModernBERT's "
                        "architecture has no Hugging Face counterpart to export to")
    if model.positions_from_padding:
        raise UserError("transformers' ELECTRA numbers positions from 0: an ELECTRA run with "
                        "model.positions_from_padding (RoBERTa's) has no Hugging Face "
                        "counterpart to export to")
    if hf_albert.exports_as_albert(model):
        raise UserError("an ELECTRA run with ALBERT's model options (model.embedding_size, "
                        "model.share_layers) has no mapping to transformers' ELECTRA; export it "
                        "with --format params")
    params = meta.unbox(params)
    if model.position_embedding == "relative":
        config, state, _ = hf_deberta.to_hf({"encoder": params["encoder"]}, model, {})
        return {"": HFModel(config, state, [
            "DeBERTa ELECTRA: the discriminator is exported as DebertaV2Model (no pooler); the "
            "generator and the discriminator's head have no DebertaV2 counterpart"])}
    missing = [k for k in ("encoder", "generator", "generator_head", "discriminator_head")
               if k not in params]
    if missing:
        raise UserError(f"the ELECTRA checkpoint lacks {', '.join(missing)}")
    generator = generator_config(heads)
    width = model.hidden_size
    discriminator = _encoder_state(params["encoder"], model)
    discriminator.update(_linear(params["discriminator_head"]["dense"],
                                 "discriminator_predictions.dense"))
    discriminator.update(_linear(params["discriminator_head"]["prediction"],
                                 "discriminator_predictions.dense_prediction"))

    embeddings = dict(params["encoder"]["embeddings"])
    if gdes.GENERATOR_WORDS in params:  # GDES: the generator's table is the shared one, E_G
        embeddings["word_embeddings"] = params[gdes.GENERATOR_WORDS]
    layers = {k: v for k, v in params["generator"].items() if k != "embeddings_project"}
    gen = _encoder_state({"embeddings": embeddings, **layers}, generator)
    if "embeddings_project" in params["generator"]:
        gen.update(_linear(params["generator"]["embeddings_project"],
                           "electra.embeddings_project"))
    head = params["generator_head"]
    gen.update(_linear(head["transform"], "generator_predictions.dense"))
    gen["generator_predictions.LayerNorm.weight"] = np.asarray(head["norm"]["scale"])
    gen["generator_predictions.LayerNorm.bias"] = np.asarray(head["norm"]["bias"])
    gen["generator_lm_head.weight"] = gen["electra.embeddings.word_embeddings.weight"].copy()
    gen["generator_lm_head.bias"] = np.asarray(head["bias"])
    notes = ["ELECTRA: the discriminator is exported as ElectraForPreTraining in OUT, the "
             f"generator as ElectraForMaskedLM in OUT/{GENERATOR_DIR} (both with the shared "
             "embeddings); the discriminator's untrained pooler is left out"]
    return {"": HFModel(electra_config(model, width, "ElectraForPreTraining"), discriminator,
                        notes),
            GENERATOR_DIR: HFModel(electra_config(generator, width, "ElectraForMaskedLM"), gen,
                                   [])}
