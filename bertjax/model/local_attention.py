"""Sliding-window attention computed block by block, at O(L x window) cost, never as [L, L].

Query i sees key j iff |i - j| <= half_window, key j is not padding and, when sequences are
packed, both belong to the same sequence: Hugging Face ModernBert's local attention (its
`local_attention` is the full width, so half_window = local_attention // 2).

Longformer's scheme: the padded sequence is cut into blocks of w >= half_window positions, so
every key a query of block c may see lies in blocks c - 1, c or c + 1. Each block of queries meets
those 3w keys (shifted views of the keys, no gather) under a mask of absolute positions. Logits
and softmax run in fp32 with the finite fill value of the full-attention path, as
model/attention.py's explicit_attention does.

A row whose every key is masked (only a padding query can have one: a real token sees itself)
averages whatever its keys hold, here the 3w keys of its blocks, in the full computation all L:
those rows differ between the two, and only those.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array

# The full path's fill value: finite, so a fully masked row cannot produce NaNs.
_FILL = -0.7 * float(np.finfo(np.float32).max)


def band_mask(length: int, half_window: int) -> np.ndarray:
    """bool [L, L]: True where |i - j| <= half_window."""
    positions = np.arange(length)
    return np.abs(positions[:, None] - positions[None, :]) <= half_window


def sliding_window_attention(query: Array, key: Array, value: Array, key_mask: Array,
                             half_window: int, pack_ids: Array | None = None, *,
                             block_size: int | None = None) -> Array:
    """Attention of [B, L, N, D] queries over the keys within `half_window` positions.

    key_mask: bool [B, L], False at padding. pack_ids: int [B, L] or None; a query sees only
    keys of its own pack id. half_window (and block_size, default half_window, at least it) are
    Python ints, so every shape is static: the function runs under jit, grad, vmap, lax.cond and
    nn.scan. Returns [B, L, N, D] in value's dtype.
    """
    half_window = int(half_window)
    if half_window < 0:
        raise ValueError(f"half_window must be >= 0, got {half_window}")
    block = max(half_window, 1) if block_size is None else int(block_size)
    if block < max(half_window, 1):
        raise ValueError(f"block_size {block} is narrower than half_window {half_window}")
    length = query.shape[1]
    if length <= 3 * block:
        # Three blocks of keys per query would cover the whole row anyway: the masked [L, L]
        # computation does no more work and skips the padding to whole blocks.
        allowed = _full_allowed(key_mask, half_window, pack_ids)
        return _masked_attention(query, key, value, allowed, "btnd,bsnd->bnts", "bnts,bsnd->btnd")
    return _blocked(query, key, value, key_mask, half_window, pack_ids, block)


def _full_allowed(key_mask: Array, half_window: int, pack_ids: Array | None) -> Array:
    """bool [B, 1, L, L]."""
    length = key_mask.shape[1]
    allowed = key_mask[:, None, None, :] & band_mask(length, half_window)[None, None]
    if pack_ids is not None:
        allowed = allowed & (pack_ids[:, None, :, None] == pack_ids[:, None, None, :])
    return allowed


def _masked_attention(query: Array, key: Array, value: Array, allowed: Array, logits_eq: str,
                      output_eq: str) -> Array:
    scale = 1.0 / jnp.sqrt(jnp.float32(query.shape[-1]))
    logits = jnp.einsum(logits_eq, query, key, preferred_element_type=jnp.float32) * scale
    logits = jnp.where(allowed, logits, jnp.float32(_FILL))
    probs = jax.nn.softmax(logits, axis=-1)
    return jnp.einsum(output_eq, probs.astype(value.dtype), value)


def _blocked(query: Array, key: Array, value: Array, key_mask: Array, half_window: int,
             pack_ids: Array | None, block: int) -> Array:
    batch, length, heads, dim = query.shape
    blocks = -(-length // block)
    tail = blocks * block - length

    def query_blocks(x: Array) -> Array:
        """[B, L, ...] -> [B, nb, w, ...], zero padded to whole blocks."""
        x = jnp.pad(x, [(0, 0), (0, tail)] + [(0, 0)] * (x.ndim - 2))
        return x.reshape(batch, blocks, block, *x.shape[2:])

    def key_windows(x: Array, fill) -> Array:
        """[B, L, ...] -> [B, nb, 3w, ...]: blocks c - 1, c, c + 1 for each query block c, a
        block of `fill` before the first and after the last."""
        pad = [(0, 0), (block, block + tail)] + [(0, 0)] * (x.ndim - 2)
        x = jnp.pad(x, pad, constant_values=fill)
        x = x.reshape(batch, blocks + 2, block, *x.shape[2:])
        return jnp.concatenate([x[:, :-2], x[:, 1:-1], x[:, 2:]], axis=2)

    # Query i of a block and key j of its window are (w + i - j) apart, whichever the block;
    # keys outside the sequence are masked through the padded key_mask.
    offsets = block + np.arange(block)[:, None] - np.arange(3 * block)[None, :]
    allowed = key_windows(key_mask, False)[:, :, None, :] & (np.abs(offsets) <= half_window)
    if pack_ids is not None:
        allowed = allowed & (query_blocks(pack_ids)[..., None]
                             == key_windows(pack_ids, -1)[:, :, None, :])
    out = _masked_attention(query_blocks(query), key_windows(key, 0), key_windows(value, 0),
                            allowed[:, :, None], "bcqnd,bcknd->bcnqk", "bcnqk,bcknd->bcqnd")
    return out.reshape(batch, blocks * block, heads, dim)[:, :length]
