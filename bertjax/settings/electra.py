"""ELECTRA's settings (Clark et al., 2020): the generator's size relative to the discriminator, the
weight of replaced token detection and how the two share the word table, refused by key name
before anything is written."""

from __future__ import annotations

import dataclasses

from bertjax.core.errors import UserError, check_choice
from bertjax.model.config import EncoderConfig
from bertjax.settings.config_keys import Section, fields_of

EMBEDDING_SHARING = ("auto", "plain", "gdes")


@dataclasses.dataclass(frozen=True)
class ElectraSettings:
    """The electra section (read with objective=electra only): the generator and the weight of
    its discriminator's loss."""

    # 0 in any size: the paper's choice (a quarter of the discriminator's width, its depth,
    # one head per 64 dimensions, a feed-forward 4x the width).
    generator_hidden_size: int = 0
    generator_num_layers: int = 0
    generator_num_heads: int = 0
    generator_intermediate_size: int = 0
    # 0: the discriminator's. The two share their embeddings, so any other value is refused.
    generator_vocab_size: int = 0
    # lambda in loss = MLM(generator) + lambda * RTD(discriminator)
    discriminator_weight: float = 50.0
    # How the discriminator shares the generator's word table: "plain" (ELECTRA's: both losses
    # train it), "gdes" (DeBERTa-v3's gradient-disentangled sharing, bertjax/model/gdes.py: the
    # generator's loss trains it, the discriminator's a residual table of its own) or "auto":
    # gdes for a DeBERTa discriminator (model.position_embedding=relative), plain otherwise.
    embedding_sharing: str = "auto"

    def gdes(self, discriminator: EncoderConfig) -> bool:
        """Whether this discriminator shares the word table by GDES (see embedding_sharing)."""
        if self.embedding_sharing == "auto":
            return discriminator.position_embedding == "relative"
        return self.embedding_sharing == "gdes"

    def generator(self, discriminator: EncoderConfig) -> EncoderConfig:
        """The generator's encoder: the discriminator's numerics, vocabulary and positions (its
        embeddings are the discriminator's), with its own, smaller, sizes."""
        vocab = self.generator_vocab_size
        if vocab and vocab != discriminator.vocab_size:
            raise UserError(f"electra.generator_vocab_size {vocab} differs from the "
                            f"discriminator's vocabulary of {discriminator.vocab_size}: the two "
                            "share their embeddings (leave it 0)")
        hidden = self.generator_hidden_size or max(1, discriminator.hidden_size // 4)
        layers = self.generator_num_layers or discriminator.num_layers
        if hidden > discriminator.hidden_size or layers > discriminator.num_layers:
            raise UserError(f"the generator ({layers} layers of {hidden}) is larger than the "
                            f"discriminator ({discriminator.num_layers} layers of "
                            f"{discriminator.hidden_size}); ELECTRA's generator is the smaller")
        heads = self.generator_num_heads or max(1, hidden // 64)
        intermediate = self.generator_intermediate_size or 4 * hidden
        try:
            return discriminator.without_adaptation().replace(
                hidden_size=hidden, num_layers=layers, num_heads=heads,
                intermediate_size=intermediate)
        except UserError as e:
            raise UserError(f"electra generator: {e}") from None


def read(config: Section) -> ElectraSettings:
    """The config's `electra` section (configs/base.py declares it for every pretraining run)."""
    values = fields_of(ElectraSettings, config.electra, "electra")
    sharing = check_choice("electra.embedding_sharing", values["embedding_sharing"],
                           EMBEDDING_SHARING)
    if sharing == "gdes" and config.objective != "electra":
        raise UserError(f"electra.embedding_sharing=gdes shares a generator's embeddings with a "
                        f"discriminator: it needs objective=electra, got {config.objective!r}")
    for key, value in values.items():
        if key in ("discriminator_weight", "embedding_sharing"):
            continue
        if int(value) < 0:
            raise UserError(f"electra.{key} must not be negative, got {value}")
    if not float(values["discriminator_weight"]) > 0:
        raise UserError(f"electra.discriminator_weight (lambda) must be positive, got "
                        f"{values['discriminator_weight']}")
    return ElectraSettings(**values)
