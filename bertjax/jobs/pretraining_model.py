"""Which model and loss a pretraining objective trains: BERT's heads (MLM with NSP or SBO) on one
encoder, or ELECTRA's generator and discriminator; and what of it run.json records."""

from __future__ import annotations


import flax.linen as nn

from bertjax.model.config import EncoderConfig
from bertjax.model.electra import ElectraForPretraining
from bertjax.model.heads import BertForPretraining
from bertjax.settings.pretrain import PretrainSettings
from bertjax.settings.shared import layout_of
from bertjax.train import objectives
from bertjax.train.electra_objective import electra_objective


def generator_of(s: PretrainSettings, encoder: EncoderConfig) -> EncoderConfig | None:
    """ELECTRA's generator for this discriminator (UserError if it does not fit), else None."""
    return s.objective.electra.generator(encoder) if s.objective.electra is not None else None


def build(s: PretrainSettings, encoder: EncoderConfig
          ) -> tuple[nn.Module, objectives.StepObjective]:
    generator = generator_of(s, encoder)
    if generator is not None:
        return (ElectraForPretraining(encoder, generator),
                electra_objective(s.objective.electra.discriminator_weight))
    return (BertForPretraining(encoder, nsp=s.objective.nsp, sbo=s.objective.sbo,
                               max_span_length=s.masking.max_span_length),
            objectives.PRETRAINING)


def compared_layout(s: PretrainSettings, encoder: EncoderConfig) -> dict:
    """The generator's layout, compared on resume beside the discriminator's ({} without)."""
    generator = generator_of(s, encoder)
    return {} if generator is None else {"generator": layout_of(generator)}


def heads_record(s: PretrainSettings, encoder: EncoderConfig) -> dict:
    """run.json's "heads": what export and fine-tuning need to know of the parameters."""
    heads = {"nsp": s.objective.nsp, "sbo": s.objective.sbo,
             "max_span_length": s.masking.max_span_length, "pooler_trained": s.objective.nsp}
    generator = generator_of(s, encoder)
    if generator is not None:
        heads["electra"] = {"generator": generator.record(),
                            "discriminator_weight": s.objective.electra.discriminator_weight}
    return heads
