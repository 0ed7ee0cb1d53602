"""Rotary position embeddings (Su et al., 2021) as Hugging Face's ModernBert applies them.

Each head's dimensions are paired as (i, i + D/2) ("rotate half", not interleaved), rotated by
position x inv_freq, in fp32 whatever the compute dtype. The tables are built once per forward
pass from the token positions, so packed sequences (positions restarting per sequence) need
nothing else.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

Array = jax.Array


def inverse_frequencies(head_dim: int, theta: float) -> np.ndarray:
    """theta^(-2i/D) for i < D/2, in fp32 as transformers computes it."""
    exponents = np.arange(0, head_dim, 2, dtype=np.float32) / np.float32(head_dim)
    return (1.0 / (np.float32(theta) ** exponents)).astype(np.float32)


def tables(positions: Array, head_dim: int, theta: float) -> tuple[Array, Array]:
    """(cos, sin), each fp32 [B, L, D], for int positions [B, L]."""
    angles = positions[..., None].astype(jnp.float32) * inverse_frequencies(head_dim, theta)
    angles = jnp.concatenate([angles, angles], axis=-1)
    return jnp.cos(angles), jnp.sin(angles)


def rotate(x: Array, cos: Array, sin: Array) -> Array:
    """x [B, L, N, D] rotated by the tables [B, L, D]; the result keeps x's dtype."""
    original = x.dtype
    x = x.astype(jnp.float32)
    half = x.shape[-1] // 2
    rotated_half = jnp.concatenate([-x[..., half:], x[..., :half]], axis=-1)
    cos, sin = cos[:, :, None, :], sin[:, :, None, :]
    return (x * cos + rotated_half * sin).astype(original)
