"""ELECTRA (Clark et al., 2020): a small generator (a masked LM) and a discriminator trained
jointly on replaced token detection.

The generator reads the masked batch and predicts the masked tokens; a sample from its
distribution (Gumbel-max, no gradient) replaces each masked token; the discriminator reads the
result and scores every token as original or replaced. A sampled token that happens to be the
original is labelled original, as in the paper.

Parameters: `encoder` (the discriminator, a BERT encoder: what fine-tuning loads), `generator`
(`embeddings_project` when the widths differ, then its layers), `generator_head` (dense + GELU +
LayerNorm to the embedding width, tied projection plus a bias) and `discriminator_head` (dense +
GELU + dense to one score). The generator has no embeddings of its own: it reads the
discriminator's (word, position, segment and their LayerNorm), as the paper shares them, and
projects their width to its hidden size as Hugging Face's `ElectraModel.embeddings_project` does.
With `gdes` (DeBERTa-v3's gradient-disentangled sharing, bertjax/model/gdes.py) the discriminator
looks its tokens up in stop_gradient(word table) + `word_embeddings_delta`, a parameter of its own.
"""

from __future__ import annotations

from typing import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.model import gdes as gdes_sharing
from bertjax.model.config import EncoderConfig
from bertjax.model.attention import context
from bertjax.model.disentangled_attention import RelativeEmbeddings
from bertjax.model.embeddings import HIDDEN_AXES
from bertjax.model.encoder import Encoder, make_layers, run_layers
from bertjax.model.primitives import dense, gather_positions, gelu, layer_norm
from bertjax.model.heads import MaskedLmHead

Array = jax.Array

# Eval (deterministic) forward passes draw the generator's samples from this fixed key, so an
# evaluation of the same parameters on the same batches always gives the same figures.
EVAL_SAMPLE_SEED = 0


class GeneratorEncoder(nn.Module):
    """The generator's transformer layers over already embedded tokens [B, L, E]."""

    config: EncoderConfig
    embedding_size: int

    @nn.compact
    def __call__(self, embedded: Array, input_mask: Array, deterministic: bool) -> Array:
        cfg = self.config
        x = embedded
        if self.embedding_size != cfg.hidden_size:
            x = dense(cfg, cfg.hidden_size, ("embed", None), "embeddings_project")(x)
            x = nn.with_logical_constraint(x, HIDDEN_AXES)
        ctx = context(cfg, input_mask)
        if cfg.position_embedding == "relative":  # DeBERTa: the generator's own table
            ctx = ctx.replace(relative=RelativeEmbeddings(cfg, name="relative_embeddings")())
        layers = make_layers(cfg, named=True)
        x, _ = run_layers(cfg, layers, x, ctx, deterministic)
        if cfg.norm == "pre":
            x = layer_norm(cfg, "final_norm")(x).astype(cfg.dtype)
        return x


class DiscriminatorHead(nn.Module):
    """Hugging Face `ElectraDiscriminatorPredictions`: dense + GELU + dense to one fp32 score."""

    config: EncoderConfig

    @nn.compact
    def __call__(self, sequence: Array) -> Array:
        cfg = self.config
        x = gelu(dense(cfg, cfg.hidden_size, ("embed", None), "dense")(sequence))
        score = dense(cfg, 1, ("embed", None), "prediction", dtype="float32")
        return score(x.astype(jnp.float32))[..., 0]


def replace_masked(input_ids: Array, positions: Array, weights: Array, masked_ids: Array,
                   sampled: Array) -> tuple[Array, Array]:
    """(the discriminator's input ids, replaced labels), both [B, L].

    Each used prediction slot's position takes its sampled token; a position is labelled
    replaced only where the sample differs from the original token. Built from a [B, P, L]
    one-hot rather than a scatter, so unused slots (position 0, weight 0) write nothing.
    """
    length = input_ids.shape[1]
    hit = (positions[..., None] == jnp.arange(length)) & (weights[..., None] > 0)
    chosen = jnp.any(hit, axis=1)
    sampled_at = jnp.sum(jnp.where(hit, sampled[..., None], 0), axis=1)
    original_at = jnp.sum(jnp.where(hit, masked_ids[..., None], 0), axis=1)
    corrupted = jnp.where(chosen, sampled_at, input_ids).astype(input_ids.dtype)
    replaced = chosen & (sampled_at != original_at)
    return corrupted, replaced.astype(jnp.int32)


def gumbel_sample(logits: Array, key: Array) -> Array:
    """One draw from softmax(logits) per row (Gumbel-max), with no gradient through it."""
    noise = jax.random.gumbel(key, logits.shape, jnp.float32)
    return jnp.argmax(jax.lax.stop_gradient(logits) + noise, axis=-1).astype(jnp.int32)


class ElectraForPretraining(nn.Module):
    """The generator and the discriminator over one pretraining batch (see module doc).

    Returns fp32 `mlm_logits` [B, P, V] (the generator's, at the masked positions),
    `rtd_logits` [B, L] (the discriminator's), and `rtd_labels` [B, L] (1: replaced) and
    `sampled_ids` [B, P]. Training draws the samples from the "dropout" stream, which the step
    derives from its key and step number, so a replayed step samples the same tokens.
    """

    config: EncoderConfig     # the discriminator
    generator: EncoderConfig  # same vocabulary and positions, smaller sizes
    gdes: bool = False        # the word table shared by GDES rather than plainly

    @nn.compact
    def __call__(self, batch: Mapping[str, Array], *, deterministic: bool = True) -> dict:
        cfg, gen = self.config, self.generator
        assert gen.vocab_size == cfg.vocab_size, "the generator shares the embeddings"
        encoder = Encoder(cfg, name="encoder")
        embedded = encoder.embeddings(batch["input_ids"], batch["segment_ids"], deterministic)
        generated = GeneratorEncoder(gen, cfg.hidden_size, name="generator")(
            embedded, batch["input_mask"], deterministic)
        hidden = gather_positions(generated, batch["masked_positions"])
        mlm_logits = MaskedLmHead(cfg, name="generator_head")(hidden, encoder.attend)

        key = (jax.random.PRNGKey(EVAL_SAMPLE_SEED) if deterministic
               else self.make_rng("dropout"))
        sampled = gumbel_sample(mlm_logits, key)
        corrupted, replaced = replace_masked(batch["input_ids"], batch["masked_positions"],
                                             batch["masked_weights"], batch["masked_ids"],
                                             sampled)
        delta = gdes_sharing.word_delta(self, cfg) if self.gdes else None
        encoded = encoder(corrupted, batch["segment_ids"], batch["input_mask"],
                          deterministic=deterministic, word_delta=delta)
        rtd_logits = DiscriminatorHead(cfg, name="discriminator_head")(encoded.sequence)
        return {"mlm_logits": mlm_logits, "rtd_logits": rtd_logits, "rtd_labels": replaced,
                "sampled_ids": sampled}
