"""Span representations: [h_start; h_end; pooled span] (Lee et al., 2017; SpanBERT), pooled by the
mean of the span's token states or by attention (a learned scalar score per token, softmax over
the span's tokens). Parameter layout:

    SpanClassifier  {"encoder", ("span_attention": {"kernel" [H, 1], "bias" [1]}),
                     "classifier": {"kernel" [3H, C], "bias" [C]}}
                    logits of the span (`span_start`, `span_end`: inclusive token positions)
    SpanScorer      {"encoder", ("span_attention"), "span_mlp": {"kernel" [3H, D], "bias" [D]},
                     "span_score": {"kernel" [D, 1], "bias" [1]}}, D = H / 4 by default:
                    score = dense(gelu([h_s; h_e; pooled] @ span_mlp))
                    QA: a score for every (start, start + k), k < max_answer_length
                    (`span_scores` [B, L, K], MASKED_LOGIT where either end is off the context)

The scorer's first layer is linear in [h_s; h_e; pooled], so it is applied to each token once
(start part, end part, pooled part) and the pooled part is accumulated span by span with an
online softmax (a running maximum, so no span's weights underflow): L x K spans cost L x K x D
additions, never an [L, K, 3H] tensor.
"""

from __future__ import annotations

from typing import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.core.errors import check_choice
from bertjax.model.config import EncoderConfig
from bertjax.model.primitives import kernel_init, zeros_init
from bertjax.model.task_heads import MASKED_LOGIT, _encode, _head

Array = jax.Array
POOLINGS = ("mean", "attention")


def check_pooling(name: str) -> str:
    return check_choice("finetune.span_pooling", name, POOLINGS)


def span_mask(length: int, start: Array, end: Array) -> Array:
    """[B, L] True on positions start..end (inclusive)."""
    positions = jnp.arange(length)[None, :]
    return (positions >= start[:, None]) & (positions <= end[:, None])


def pool_span(hidden: Array, scores: Array | None, start: Array, end: Array) -> Array:
    """[B, H]: the mean of hidden[b, start..end] (scores None), or its softmax(scores)-weighted
    sum over those positions."""
    inside = span_mask(hidden.shape[1], start, end)
    if scores is None:
        weights = inside / jnp.maximum(jnp.sum(inside, axis=1, keepdims=True), 1)
    else:
        weights = jax.nn.softmax(jnp.where(inside, scores, -jnp.inf), axis=-1)
    return jnp.einsum("bl,blh->bh", weights, hidden)


def _at(hidden: Array, positions: Array) -> Array:
    return jnp.take_along_axis(hidden, positions[:, None, None].astype(jnp.int32), axis=1)[:, 0]


class SpanClassifier(nn.Module):
    """Outputs `logits` [B, C] of the span [span_start, span_end] of each row."""

    config: EncoderConfig
    num_labels: int
    pooling: str = "mean"
    freeze_encoder: bool = False

    @nn.compact
    def __call__(self, batch: Mapping[str, Array], *, deterministic: bool = True) -> dict:
        cfg = self.config
        hidden = _encode(cfg, batch, deterministic, self.freeze_encoder).sequence
        hidden = hidden.astype(jnp.float32)
        start, end = batch["span_start"], batch["span_end"]
        scores = (_head(cfg, 1, "span_attention")(hidden)[..., 0]
                  if self.pooling == "attention" else None)
        represented = jnp.concatenate(
            [_at(hidden, start), _at(hidden, end), pool_span(hidden, scores, start, end)], -1)
        represented = nn.Dropout(cfg.hidden_dropout)(represented, deterministic=deterministic)
        return {"logits": _head(cfg, self.num_labels, "classifier")(represented)}


def _shifted(x: Array, k: int, fill) -> Array:
    """x[:, i + k] at position i (`fill` past the end)."""
    if k == 0:
        return x
    pad = [(0, 0), (0, k)] + [(0, 0)] * (x.ndim - 2)
    return jnp.pad(x, pad, constant_values=fill)[:, k:]


class _SplitDense(nn.Module):
    """A Dense over [h_s; h_e; pooled] ([3H, D] kernel) applied blockwise to token states:
    (states @ start block + bias, states @ end block, states @ pooled block)."""

    config: EncoderConfig
    features: int

    @nn.compact
    def __call__(self, hidden: Array) -> tuple[Array, Array, Array]:
        cfg, h = self.config, hidden.shape[-1]
        kernel = self.param("kernel", kernel_init(cfg, ("embed", None)), (3 * h, self.features),
                            jnp.dtype(cfg.param_dtype)).astype(jnp.float32)
        bias = self.param("bias", zeros_init((None,)), (self.features,),
                          jnp.dtype(cfg.param_dtype)).astype(jnp.float32)
        return (hidden @ kernel[:h] + bias, hidden @ kernel[h:2 * h], hidden @ kernel[2 * h:])


class SpanScorer(nn.Module):
    """Outputs `span_scores` [B, L, K]: the score of the answer span (i, i + k)."""

    config: EncoderConfig
    max_answer_length: int
    pooling: str = "mean"
    # 0: a quarter of the hidden size. Training keeps an [L, K, D] activation per window for the
    # backward pass, so D is what the scorer's memory scales with.
    mlp_size: int = 0
    freeze_encoder: bool = False

    @nn.compact
    def __call__(self, batch: Mapping[str, Array], *, deterministic: bool = True) -> dict:
        cfg = self.config
        hidden = _encode(cfg, batch, deterministic, self.freeze_encoder).sequence
        hidden = nn.Dropout(cfg.hidden_dropout)(hidden.astype(jnp.float32),
                                                deterministic=deterministic)
        d = self.mlp_size or max(cfg.hidden_size // 4, 1)
        from_start, from_end, pooled_part = _SplitDense(cfg, d, name="span_mlp")(hidden)
        scores = (_head(cfg, 1, "span_attention")(hidden)[..., 0]
                  if self.pooling == "attention" else jnp.zeros(hidden.shape[:2]))
        inside = batch["context_mask"].astype(bool)
        score_layer = _head(cfg, 1, "span_score")
        # Online softmax over span lengths: after step k the running (max, denominator,
        # numerator) of each start i cover positions i..i+k.
        top = scores
        denominator = jnp.ones_like(scores)
        numerator = pooled_part
        end_inside = inside
        out = []
        for k in range(self.max_answer_length):
            if k:
                s_k = _shifted(scores, k, -jnp.inf)
                new_top = jnp.maximum(top, s_k)
                keep, add = jnp.exp(top - new_top), jnp.exp(s_k - new_top)
                denominator = denominator * keep + add
                numerator = (numerator * keep[..., None]
                             + add[..., None] * _shifted(pooled_part, k, 0.0))
                top = new_top
                end_inside = end_inside & _shifted(inside, k, False)
            pre = from_start + _shifted(from_end, k, 0.0) + numerator / denominator[..., None]
            score = score_layer(nn.gelu(pre, approximate=False))[..., 0]
            out.append(jnp.where(inside & end_inside, score, MASKED_LOGIT))
        return {"span_scores": jnp.stack(out, axis=-1)}
