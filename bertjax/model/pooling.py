"""Token states -> one vector per text: the poolings that sentence embeddings are made with.

All run on the device inside the jitted encode function, over padded batches: `mask` [B, T] marks
real tokens. Mean pooling counts every real token, [CLS] and [SEP] included, which is what
sentence-transformers does (so an imported all-MiniLM-L6-v2 gives its published embeddings).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

POOLINGS = ("cls", "mean", "max", "last4_mean")


def masked_mean(states: jax.Array, mask: jax.Array) -> jax.Array:
    """states [B, T, H], mask [B, T] -> [B, H] fp32."""
    weights = mask.astype(jnp.float32)[..., None]
    total = jnp.sum(states.astype(jnp.float32) * weights, axis=-2)
    return total / jnp.maximum(jnp.sum(weights, axis=-2), 1e-9)


def masked_max(states: jax.Array, mask: jax.Array) -> jax.Array:
    lowest = jnp.finfo(jnp.float32).min
    return jnp.max(jnp.where(mask[..., None] > 0, states.astype(jnp.float32), lowest), axis=-2)


def pool(layers: jax.Array, mask: jax.Array, pooling: str) -> jax.Array:
    """layers [N+1, B, T, H] (embeddings first, last layer last) -> [B, H] fp32.

    With explicit layer selection the caller passes only the chosen layers; `last4_mean` then
    averages the last four of them (all of them when fewer than four were chosen).
    """
    if pooling == "cls":
        return layers[-1][:, 0].astype(jnp.float32)
    if pooling == "mean":
        return masked_mean(layers[-1], mask)
    if pooling == "max":
        return masked_max(layers[-1], mask)
    if pooling == "last4_mean":
        return masked_mean(jnp.mean(layers[-4:].astype(jnp.float32), axis=0), mask)
    raise ValueError(f"unknown pooling {pooling!r}; choose one of {', '.join(POOLINGS)}")


def normalized(vectors: jax.Array) -> jax.Array:
    norms = jnp.linalg.norm(vectors, axis=-1, keepdims=True)
    return vectors / jnp.maximum(norms, 1e-12)
