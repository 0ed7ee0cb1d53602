"""Bidirectional attention: what each layer may see (padding, packed sequences, a sliding
window) and the kernels that compute it.

A forward pass builds one AttentionContext from the batch; every layer reads it. Global layers
attend over the whole row (less padding and, when sequences are packed, other sequences); a
sliding-window layer also stops at `sliding_window` // 2 positions either side and is computed
block by block (model/local_attention.py), never as a masked [L, L] matrix.
"""

from __future__ import annotations

import flax.struct
import jax
import jax.numpy as jnp

from bertjax.model import (attention_choice, local_attention, low_precision_matmul, rotary,
                           splash_attention)
from bertjax.model.config import EncoderConfig
from bertjax.model.target_platform import target_platform

Array = jax.Array


@flax.struct.dataclass
class AttentionContext:
    key_mask: Array  # bool [B, L]: False at padding
    pack_ids: Array | None = None  # int [B, L]: which packed sequence a token belongs to
    # Rotary tables (cos, sin), fp32 [B, L, D], for the global and the sliding-window layers.
    rope_global: tuple[Array, Array] | None = None
    rope_local: tuple[Array, Array] | None = None
    # DeBERTa's relative embedding table after its norm, fp32 [2S, H] (the encoder's, shared).
    relative: Array | None = None
    # DeBERTa's enhanced mask decoder: int [B, P], the positions its P query rows stand at.
    query_positions: Array | None = None

    def full_mask(self) -> Array:
        """bool [B, 1, 1, L], or [B, 1, L, L] when sequences are packed."""
        keys = self.key_mask[:, None, None, :]
        if self.pack_ids is None:
            return keys
        same = self.pack_ids[:, :, None] == self.pack_ids[:, None, :]
        return keys & same[:, None]

    def band_mask(self, half_window: int) -> Array:
        """full_mask() within `half_window` positions: bool [B, 1, L, L]."""
        band = local_attention.band_mask(self.key_mask.shape[1], half_window)
        return self.full_mask() & band[None, None]


def context(config: EncoderConfig, input_mask: Array, positions: Array | None = None,
            pack_ids: Array | None = None) -> AttentionContext:
    """The context of a batch: `positions` [B, L] default to 0..L-1 in every row."""
    key_mask = input_mask.astype(bool)
    if config.position_embedding != "rope":
        return AttentionContext(key_mask, pack_ids)
    if positions is None:
        positions = jnp.broadcast_to(jnp.arange(key_mask.shape[1]), key_mask.shape)
    rope_global = rotary.tables(positions, config.head_dim, config.rope_theta)
    rope_local = (rotary.tables(positions, config.head_dim, config.rope_local_theta)
                  if config.has_local_layers else None)
    return AttentionContext(key_mask, pack_ids, rope_global, rope_local)


def attend(query: Array, key: Array, value: Array, ctx: AttentionContext, config: EncoderConfig,
           is_global, dropout_rng: Array | None = None) -> Array:
    """Attention of one layer over [B, L, N, D] projections, rotated first when the model uses
    rotary positions. `is_global` is a Python bool (layers in a loop) or a traced one (layers
    under nn.scan: both kinds are compiled and lax.cond runs the layer's; with splash each
    branch is its own kernel, the global one with a full mask, the local one with a band).
    Returns [B, L, N, D], or [B, N, L, D] where `heads_major()` says so."""
    if not config.has_local_layers:
        return _global(query, key, value, ctx, config, dropout_rng, ctx.rope_global)
    if isinstance(is_global, bool):
        kind = _global if is_global else _local
        return kind(query, key, value, ctx, config, dropout_rng,
                    ctx.rope_global if is_global else ctx.rope_local)
    return jax.lax.cond(
        is_global,
        lambda q, k, v: _global(q, k, v, ctx, config, dropout_rng, ctx.rope_global),
        lambda q, k, v: _local(q, k, v, ctx, config, dropout_rng, ctx.rope_local),
        query, key, value)


def _rotated(query: Array, key: Array, rope) -> tuple[Array, Array]:
    if rope is None:
        return query, key
    return rotary.rotate(query, *rope), rotary.rotate(key, *rope)


def kernel_of(config: EncoderConfig, kind: str, ctx: AttentionContext,
              dropout_rng: Array | None) -> str:
    """The kernel (attention_choice) a layer of `kind` runs, on the platform being traced for."""
    return attention_choice.choose(config, kind, platform=target_platform(),
                                   dropout=bool(_dropout(config, dropout_rng)),
                                   packed=ctx.pack_ids is not None)


def heads_major(config: EncoderConfig, ctx: AttentionContext, dropout_rng: Array | None) -> bool:
    """Whether attend() returns the splash kernel's [B, N, L, D] (both layer kinds take the
    kernel together or neither does). Not where the output projection goes through
    low_precision_matmul, which contracts trailing axes only."""
    if low_precision_matmul.use_fast_gradients(config.operand_dtype):
        return False
    return kernel_of(config, attention_choice.GLOBAL, ctx, dropout_rng) == attention_choice.SPLASH


def _global(query, key, value, ctx, config, dropout_rng, rope) -> Array:
    query, key = _rotated(query, key, rope)
    kernel = kernel_of(config, attention_choice.GLOBAL, ctx, dropout_rng)
    if kernel == attention_choice.SPLASH:
        return splash_attention.splash_attention(
            query, key, value, ctx.key_mask, ctx.pack_ids, interpret=_interpret(),
            heads_major=heads_major(config, ctx, dropout_rng))
    if kernel == attention_choice.EXPLICIT:
        return explicit_attention(query, key, value, ctx.full_mask(),
                                  dropout_rate=_dropout(config, dropout_rng),
                                  dropout_rng=dropout_rng)
    # "auto" resolved to XLA keeps the backend's own choice, as jax.nn.dot_product_attention's.
    implementation = "" if kernel == attention_choice.XLA and config.attention_implementation in (
        "auto", "") else kernel
    return attention(query, key, value, ctx.full_mask(), implementation=implementation)


def _local(query, key, value, ctx, config, dropout_rng, rope) -> Array:
    query, key = _rotated(query, key, rope)
    half = config.sliding_window // 2
    kernel = kernel_of(config, attention_choice.SLIDING_WINDOW, ctx, dropout_rng)
    if kernel == attention_choice.SPLASH:
        return splash_attention.splash_attention(
            query, key, value, ctx.key_mask, ctx.pack_ids, half_window=half,
            interpret=_interpret(), heads_major=heads_major(config, ctx, dropout_rng))
    if kernel == attention_choice.EXPLICIT:
        # Dropout needs the probabilities themselves: spelled out over the banded mask.
        return explicit_attention(query, key, value, ctx.band_mask(half),
                                  dropout_rate=_dropout(config, dropout_rng),
                                  dropout_rng=dropout_rng)
    return local_attention.sliding_window_attention(query, key, value, ctx.key_mask, half,
                                                    pack_ids=ctx.pack_ids)


def _interpret() -> bool:
    """Off a TPU the Pallas kernel runs in Pallas's interpreter."""
    return target_platform() != "tpu"


def _dropout(config: EncoderConfig, dropout_rng: Array | None) -> float:
    return config.attention_dropout if dropout_rng is not None else 0.0


def attention(query: Array, key: Array, value: Array, mask: Array, *, dropout_rate: float = 0.0,
              dropout_rng: Array | None = None, implementation: str = "") -> Array:
    """Bidirectional attention over [B, T, N, D] inputs; `mask` is bool [B, 1, 1 or T, S].

    Without dropout this is `jax.nn.dot_product_attention`, which the backend may fuse
    (`implementation`: "" the backend's choice, "xla", "cudnn"). cuDNN's fused kernel takes
    padding as key lengths rather than a mask: BERT's padding is a suffix, so the lengths are the
    mask's counts. BERT's dropout on the attention probabilities needs the probabilities
    themselves, so then the same computation is spelled out (fp32 logits and softmax, as the
    fused path does).
    """
    if dropout_rate == 0.0 or dropout_rng is None:
        if implementation == "cudnn":
            lengths = jnp.sum(mask[:, 0, 0, :], axis=-1, dtype=jnp.int32)
            return jax.nn.dot_product_attention(query, key, value,
                                                key_value_seq_lengths=lengths,
                                                implementation="cudnn")
        return jax.nn.dot_product_attention(query, key, value, mask=mask,
                                            implementation=implementation or None)
    return explicit_attention(query, key, value, mask, dropout_rate=dropout_rate,
                              dropout_rng=dropout_rng)


def explicit_attention(query: Array, key: Array, value: Array, mask: Array, *,
                       dropout_rate: float = 0.0, dropout_rng: Array | None = None) -> Array:
    scale = 1.0 / jnp.sqrt(jnp.float32(query.shape[-1]))
    logits = jnp.einsum("btnd,bsnd->bnts", query, key, preferred_element_type=jnp.float32)
    logits = logits * scale
    # The fused path's fill value: finite, so a fully masked row cannot produce NaNs.
    logits = jnp.where(mask, logits, jnp.float32(-0.7) * jnp.finfo(jnp.float32).max)
    probs = jax.nn.softmax(logits, axis=-1)
    if dropout_rate > 0.0 and dropout_rng is not None:
        keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs.shape)
        probs = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
    return jnp.einsum("bnts,bsnd->btnd", probs.astype(value.dtype), value)
