"""Which model and loss a pretraining objective trains: BERT's heads (MLM with NSP or SBO, and
DeBERTa's enhanced mask decoder before the MLM head) on one encoder, or ELECTRA's generator and
discriminator; what of it run.json records; and its model FLOPs a step."""

from __future__ import annotations


import flax.linen as nn

from bertjax.core.errors import UserError
from bertjax.data.length_schedule import Phase
from bertjax.interop.hf_roberta import HEADS_KEY
from bertjax.model.config import EncoderConfig
from bertjax.model.flops import train_step_flops
from bertjax.model.electra import ElectraForPretraining
from bertjax.model.heads import BertForPretraining
from bertjax.settings.pretrain import PretrainSettings
from bertjax.settings.shared import layout_of
from bertjax.train import objectives
from bertjax.train.electra_objective import electra_objective


def generator_of(s: PretrainSettings, encoder: EncoderConfig) -> EncoderConfig | None:
    """ELECTRA's generator for this discriminator (UserError if it does not fit), else None."""
    return s.objective.electra.generator(encoder) if s.objective.electra is not None else None


def check_decoder(s: PretrainSettings, encoder: EncoderConfig) -> None:
    """model.enhanced_mask_decoder on the encoder it decodes (from_checkpoint: the recorded)."""
    if s.model.enhanced_mask_decoder and encoder.position_embedding != "relative":
        raise UserError(f"model.enhanced_mask_decoder is DeBERTa's: the init checkpoint's encoder "
                        f"has position_embedding {encoder.position_embedding!r}, not relative")


def build(s: PretrainSettings, encoder: EncoderConfig
          ) -> tuple[nn.Module, objectives.StepObjective]:
    generator = generator_of(s, encoder)
    if generator is not None:
        return (ElectraForPretraining(encoder, generator, s.objective.electra.gdes(encoder)),
                electra_objective(s.objective.electra.discriminator_weight))
    return (BertForPretraining(encoder, nsp=s.objective.nsp, sbo=s.objective.sbo,
                               max_span_length=s.masking.max_span_length,
                               enhanced_mask_decoder=s.model.enhanced_mask_decoder),
            objectives.PRETRAINING)


def step_flops(s: PretrainSettings, encoder: EncoderConfig, phase: Phase) -> float:
    """Analytic model FLOPs of one optimizer step of `phase` on all devices (bertjax/model/
    flops.py); ELECTRA's generator too (an MLM at the masked positions)."""
    flops = train_step_flops(encoder, s.train.batch_size, phase.seq_len, phase.max_predictions,
                             nsp=s.objective.nsp, sbo=s.objective.sbo,
                             decoder_passes=s.model.enhanced_mask_decoder).total
    generator = generator_of(s, encoder)
    if generator is not None:
        flops += train_step_flops(generator, s.train.batch_size, phase.seq_len,
                                  phase.max_predictions, nsp=False).total
    return flops


def embedding_sharing(s: PretrainSettings, encoder: EncoderConfig) -> str:
    """"gdes" or "plain": how ELECTRA's discriminator shares the word table (settings/electra)."""
    return "gdes" if s.objective.electra.gdes(encoder) else "plain"


def compared_layout(s: PretrainSettings, encoder: EncoderConfig) -> dict:
    """The generator's layout and the embedding sharing (GDES adds a parameter) and, for
    DeBERTa, the decoder's passes, compared on resume beside the discriminator's (recorded only
    for those)."""
    generator = generator_of(s, encoder)
    compared = {} if generator is None else {"generator": layout_of(generator),
                                             "embedding_sharing": embedding_sharing(s, encoder)}
    if encoder.position_embedding == "relative":  # 0 too: a decoder dropped on resume
        compared["enhanced_mask_decoder"] = s.model.enhanced_mask_decoder
    return compared


def heads_record(s: PretrainSettings, encoder: EncoderConfig) -> dict:
    """run.json's "heads": what export and fine-tuning need to know of the parameters."""
    heads = {"nsp": s.objective.nsp, "sbo": s.objective.sbo,
             "max_span_length": s.masking.max_span_length, "pooler_trained": s.objective.nsp}
    if encoder.positions_from_padding and s.data.languages.strip():
        heads[HEADS_KEY] = "xlm-roberta"  # XLM-R: RoBERTa's layout, trained on several languages
    if s.model.enhanced_mask_decoder:
        heads["enhanced_mask_decoder"] = s.model.enhanced_mask_decoder
    generator = generator_of(s, encoder)
    if generator is not None:
        heads["electra"] = {"generator": generator.record(),
                            "discriminator_weight": s.objective.electra.discriminator_weight,
                            "embedding_sharing": embedding_sharing(s, encoder)}
    return heads
