"""Pretraining heads on the encoder: masked LM (tied), next-sentence prediction, span boundary.

Vocabulary scores are computed only at the masked positions: the hidden states are gathered to
[B, P, H] first and projected after, so no [B, L, V] tensor ever exists (P is ~15% of L, and the
projection is the largest matmul of a small model). Everything returned is fp32.
"""

from __future__ import annotations

from typing import Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.model.attention import context
from bertjax.model.config import EncoderConfig
from bertjax.model.encoder import Encoder
from bertjax.model.enhanced_mask_decoder import EnhancedMaskDecoder, last_layer_params
from bertjax.model.primitives import (activate, dense, gather_positions, gelu, kernel_init,
                                      layer_norm, zeros_init)

Array = jax.Array
Projection = Callable[[Array], Array]

LOGITS_AXES = ("batch", None, "vocab")


class MaskedLmHead(nn.Module):
    """Hugging Face `cls.predictions` (ModernBert's `head` + `decoder`): dense + GELU +
    LayerNorm, tied projection plus a bias."""

    config: EncoderConfig

    @nn.compact
    def __call__(self, hidden: Array, project: Projection) -> Array:
        cfg = self.config
        # To the embedding width: the tied projection reads the word table's rows.
        x = activate(cfg, dense(cfg, cfg.embedding_width, ("embed", None), "transform",
                                use_bias=cfg.use_bias)(hidden))
        x = layer_norm(cfg, "norm")(x)
        bias = self.param("bias", zeros_init(("vocab",)), (cfg.vocab_size,), cfg.param_dtype)
        logits = project(x) + bias.astype(jnp.float32)
        return nn.with_logical_constraint(logits, LOGITS_AXES)


class SpanBoundaryHead(nn.Module):
    """SpanBERT's span boundary objective (Joshi et al., 2020, eq. 2).

    Each masked token is predicted from the encodings just outside its span and a learned
    embedding of its offset inside the span: concat(h[left], h[right], p[offset]) -> two
    (dense + GELU + LayerNorm) layers of width H -> tied projection plus its own bias. SpanBERT's
    code sizes the offset table by the longest span (`max_targets`); offsets beyond it are clipped.
    """

    config: EncoderConfig
    max_span_length: int

    @nn.compact
    def __call__(self, sequence: Array, span_left: Array, span_right: Array, span_offset: Array,
                 project: Projection) -> Array:
        cfg = self.config
        offsets = self.param("position_embeddings", kernel_init(cfg, (None, "embed")),
                             (self.max_span_length, cfg.hidden_size), cfg.param_dtype)
        offset = jnp.clip(span_offset, 0, self.max_span_length - 1)
        x = jnp.concatenate([
            gather_positions(sequence, span_left),
            gather_positions(sequence, span_right),
            jnp.take(offsets, offset, axis=0).astype(cfg.dtype),
        ], axis=-1)
        for i, width in enumerate((cfg.hidden_size, cfg.embedding_width)):
            x = gelu(dense(cfg, width, ("embed", None), f"dense_{i}")(x))
            x = layer_norm(cfg, f"norm_{i}")(x).astype(cfg.dtype)
        bias = self.param("bias", zeros_init(("vocab",)), (cfg.vocab_size,), cfg.param_dtype)
        logits = project(x) + bias.astype(jnp.float32)
        return nn.with_logical_constraint(logits, LOGITS_AXES)


class BertForPretraining(nn.Module):
    """The encoder plus the pretraining heads (Hugging Face `BertForPreTraining`, plus SBO).

    Parameters: `encoder`, `mlm`, `nsp` (if nsp), `sbo` (if sbo), `emd` (if
    enhanced_mask_decoder: DeBERTa's decoder, that many passes of the last layer before the MLM
    head, model/enhanced_mask_decoder.py). Reads, of the pretraining batch declared in
    `bertjax.data.schema`, its `INPUTS`, `masked_positions`, with sbo its `SPAN_FIELDS` and, when
    documents are packed, their `positions` and `pack_ids`; returns fp32 `mlm_logits` [B, P, V],
    `nsp_logits` [B, 2], `sbo_logits`
    [B, P, V] (P = max_predictions).
    """

    config: EncoderConfig
    nsp: bool = True
    sbo: bool = False
    max_span_length: int = 10
    enhanced_mask_decoder: int = 0

    @nn.compact
    def __call__(self, batch: Mapping[str, Array], *, deterministic: bool = True) -> dict:
        cfg = self.config
        if self.sbo and self.max_span_length <= 0:
            raise ValueError(f"max_span_length must be positive, got {self.max_span_length}")
        # The decoder reads the last layer's input, carried through the layers beside the output.
        encoder = Encoder(cfg, keep_last_input=self.enhanced_mask_decoder > 0, name="encoder")
        encoded = encoder(batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                          deterministic=deterministic, positions=batch.get("positions"),
                          pack_ids=batch.get("pack_ids"))
        masked = batch["masked_positions"]
        if self.enhanced_mask_decoder:
            ctx = context(cfg, batch["input_mask"], pack_ids=batch.get("pack_ids")).replace(
                relative=encoder.relative_embeddings())
            positions = (masked if batch.get("positions") is None
                         else gather_positions(batch["positions"][..., None], masked)[..., 0])
            hidden = EnhancedMaskDecoder(cfg, self.enhanced_mask_decoder, name="emd")(
                encoded.last_input, ctx, last_layer_params(cfg, encoder.variables["params"]),
                masked, positions, deterministic)
        else:
            hidden = gather_positions(encoded.sequence, masked)
        outputs = {"mlm_logits": MaskedLmHead(cfg, name="mlm")(hidden, encoder.attend)}
        if self.nsp:
            # fp32: two outputs, negligible cost, and the loss sees them directly.
            nsp = dense(cfg, 2, ("embed", None), "nsp", dtype="float32")
            outputs["nsp_logits"] = nsp(encoded.pooled.astype(jnp.float32))
        if self.sbo:
            head = SpanBoundaryHead(cfg, self.max_span_length, name="sbo")
            outputs["sbo_logits"] = head(encoded.sequence, batch["span_left"],
                                         batch["span_right"], batch["span_offset"],
                                         encoder.attend)
        return outputs
