"""DeBERTa's disentangled attention (He et al., 2021; v2/v3 as Hugging Face's
`DebertaV2Model` computes it), for model.position_embedding="relative".

Scores are content-to-content plus content-to-position plus position-to-content, all divided by
sqrt(head size x 3):

    c2p[i, j] = q_i . pos_key[bucket(i - j) + S]      pos_key = key projection of the table
    p2c[i, j] = k_j . pos_query[bucket(i - j) + S]    pos_query = query projection of the table

S is the table's half size (position_buckets, or max_relative_positions without buckets), the
index is clipped to [0, 2S), and bucket() keeps distances under S / 2 as they are and puts the
longer ones in log-spaced buckets up to max_relative_positions (Hugging Face's
make_log_bucket_position, computed here on the host in float32 as torch does, since it depends
only on the static length). The relative embedding table is the encoder's, LayerNorm-ed once
per forward ("norm_rel_ebd": "layer_norm") and shared by every layer, whose own query and key
projections project it ("share_att_key"). There are no absolute positions.

The probabilities are spelled out (fp32 logits and softmax): no fused kernel takes the position
terms, which cost two [B, N, L, 2S] products and their gathers per layer.
"""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.model.config import EncoderConfig
from bertjax.model.primitives import kernel_init, layer_norm

Array = jax.Array
# The three score terms Hugging Face divides by sqrt(d * scale_factor): c2c, c2p, p2c.
SCALE_FACTOR = 3


class RelativeEmbeddings(nn.Module):
    """The shared relative embedding table after its LayerNorm: fp32 [2S, H]. Parameters:
    `table` (Hugging Face's encoder.rel_embeddings) and `norm` (encoder.LayerNorm)."""

    config: EncoderConfig

    @nn.compact
    def __call__(self) -> Array:
        cfg = self.config
        table = self.param("table", kernel_init(cfg, (None, "embed")),
                           (cfg.relative_table_size, cfg.hidden_size), cfg.param_dtype)
        return layer_norm(cfg, "norm")(table.astype(jnp.float32))


def log_buckets(relative: np.ndarray, buckets: int, span: int) -> np.ndarray:
    """Hugging Face's make_log_bucket_position in float32, as torch computes it."""
    f32 = np.float32
    sign = np.sign(relative)
    mid = buckets // 2
    near = (relative < mid) & (relative > -mid)
    absolute = np.where(near, mid - 1, np.abs(relative)).astype(f32)
    scale = f32(np.log(f32((span - 1) / mid)))
    logs = np.ceil(np.log(absolute / f32(mid)) / scale * f32(mid - 1)) + f32(mid)
    return np.where(absolute <= mid, relative.astype(f32), logs * sign).astype(np.int64)


def score_indices(length: int, config: EncoderConfig) -> tuple[np.ndarray, np.ndarray]:
    """(c2p, p2c) table rows, int32 [L, L] indexed [query, key]: Hugging Face's
    clamp(R + S) and, for p2c, clamp(-R + S) read transposed, R[a, b] the bucketed a - b."""
    ids = np.arange(length)
    relative = ids[:, None] - ids[None, :]
    if config.position_buckets:
        relative = log_buckets(relative, config.position_buckets, config.relative_span)
    half = config.relative_table_size // 2
    c2p = np.clip(relative + half, 0, 2 * half - 1)
    p2c = np.clip(-relative + half, 0, 2 * half - 1).T
    return c2p.astype(np.int32), p2c.astype(np.int32)


def attention(query: Array, key: Array, value: Array, pos_query: Array, pos_key: Array,
              mask: Array, config: EncoderConfig, dropout_rng: Array | None = None,
              query_positions: Array | None = None) -> Array:
    """query/key/value [B, L, N, D], pos_query/pos_key [2S, N, D] (the layer's projections of
    the relative table), `mask` bool [B, 1, 1 or L, L] -> [B, L, N, D]. With `query_positions`
    int [B, P] (the enhanced mask decoder's), the queries are P rows [B, P, N, D] standing at
    those positions of the keys' sequence, and the result is [B, P, N, D]."""
    f32 = jnp.float32
    content = jnp.einsum("btnd,bsnd->bnts", query, key, preferred_element_type=f32)
    query_products = jnp.einsum("btnd,rnd->bntr", query, pos_key.astype(query.dtype),
                                preferred_element_type=f32)
    key_products = jnp.einsum("bsnd,rnd->bnsr", key, pos_query.astype(key.dtype),
                              preferred_element_type=f32)
    if query_positions is None:
        length = query.shape[1]
        c2p_index, p2c_index = score_indices(length, config)
        rows = np.arange(length)[:, None]
        c2p = query_products[:, :, rows, c2p_index]
        # p2c[i, j] reads key j's row of the products: gathered along the keys' axis, transposed.
        p2c = key_products[:, :, rows.T, p2c_index]
    else:
        c2p, p2c = _scores_at(query_products, key_products, query_positions, config)
        if mask.shape[2] > 1:  # packed rows: each query's own row of the mask
            mask = jnp.take_along_axis(mask, query_positions[:, None, :, None], axis=2)
    scale = jnp.sqrt(f32(query.shape[-1] * SCALE_FACTOR))
    logits = (content + c2p + p2c) / scale
    # Finite, as attention.explicit_attention's: a fully masked row cannot produce NaNs.
    logits = jnp.where(mask, logits, f32(-0.7) * jnp.finfo(f32).max)
    probs = jax.nn.softmax(logits, axis=-1)
    if dropout_rng is not None and config.attention_dropout > 0.0:
        rate = config.attention_dropout
        keep = jax.random.bernoulli(dropout_rng, 1.0 - rate, probs.shape)
        probs = jnp.where(keep, probs / (1.0 - rate), 0.0)
    return jnp.einsum("bnts,bsnd->btnd", probs.astype(value.dtype), value)


def _scores_at(query_products: Array, key_products: Array, query_positions: Array,
               config: EncoderConfig) -> tuple[Array, Array]:
    """(c2p, p2c) fp32 [B, N, P, L] of P queries at `query_positions` [B, P]: the rows of
    score_indices' tables at those positions. query_products [B, N, P, 2S], key_products
    [B, N, L, 2S]."""
    batch, slots = query_positions.shape
    length = key_products.shape[2]
    c2p_table, p2c_table = (jnp.asarray(table) for table in score_indices(length, config))
    c2p_index, p2c_index = c2p_table[query_positions], p2c_table[query_positions]  # [B, P, L]
    rows = jnp.arange(batch)[:, None, None]
    # Advanced indices around a slice: the result is [B, P, L, N], heads last.
    c2p = query_products[rows, :, jnp.arange(slots)[None, :, None], c2p_index]
    p2c = key_products[rows, :, jnp.arange(length)[None, None, :], p2c_index]
    return c2p.transpose(0, 3, 1, 2), p2c.transpose(0, 3, 1, 2)
