"""A linear-chain CRF in JAX: log-likelihood (forward algorithm in log space) and Viterbi decoding.

Static shapes throughout (`lax.scan` over the length axis). The `mask` says which positions belong
to the chain; masked positions are SKIPPED, not just cut off at the end: the chain runs over the
unmasked positions in order, so the same code serves a padded sentence, a chain over first
subwords only (gaps between words), and a row with no position at all (log-likelihood 0).

    score(y) = start[y_1] + sum_i emissions[i, y_i] + sum_i transitions[y_i, y_i+1] + end[y_n]
    log p(y | x) = score(y) - logsumexp over all tag sequences of score
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

Array = jax.Array


def _time_major(*arrays: Array) -> tuple[Array, ...]:
    return tuple(jnp.swapaxes(a, 0, 1) for a in arrays)


def _fp32(*arrays) -> tuple[Array, ...]:
    return tuple(jnp.asarray(a, jnp.float32) for a in arrays)


def sequence_score(emissions: Array, tags: Array, mask: Array, transitions: Array,
                   start: Array, end: Array) -> Array:
    """score(tags) per row: emissions [B, T, C], tags and mask [B, T] -> [B] (fp32)."""
    emissions, transitions, start, end = _fp32(emissions, transitions, start, end)
    mask = jnp.asarray(mask, bool)
    tags = jnp.asarray(tags, jnp.int32)
    emitted = jnp.take_along_axis(emissions, tags[..., None], axis=-1)[..., 0]

    def body(carry, xs):
        total, previous, seen = carry
        tag, on, emission = xs
        step = jnp.where(seen, transitions[previous, tag], start[tag]) + emission
        return (jnp.where(on, total + step, total), jnp.where(on, tag, previous), seen | on), None

    rows = emissions.shape[0]
    init = (jnp.zeros(rows, jnp.float32), jnp.zeros(rows, jnp.int32), jnp.zeros(rows, bool))
    (total, last, seen), _ = jax.lax.scan(body, init, _time_major(tags, mask, emitted))
    return jnp.where(seen, total + end[last], 0.0)


def log_partition(emissions: Array, mask: Array, transitions: Array, start: Array,
                  end: Array) -> Array:
    """log of the sum over all tag sequences of exp(score): [B] (fp32)."""
    emissions, transitions, start, end = _fp32(emissions, transitions, start, end)
    mask = jnp.asarray(mask, bool)

    def body(carry, xs):
        alpha, seen = carry
        on, emission = xs
        moved = jax.nn.logsumexp(alpha[:, :, None] + transitions[None], axis=1)
        new = jnp.where(seen[:, None], moved, start[None]) + emission
        return (jnp.where(on[:, None], new, alpha), seen | on), None

    rows, _, classes = emissions.shape
    init = (jnp.zeros((rows, classes), jnp.float32), jnp.zeros(rows, bool))
    (alpha, seen), _ = jax.lax.scan(body, init, _time_major(mask, emissions))
    return jnp.where(seen, jax.nn.logsumexp(alpha + end[None], axis=-1), 0.0)


def log_likelihood(emissions: Array, tags: Array, mask: Array, transitions: Array,
                   start: Array, end: Array) -> Array:
    """log p(tags | emissions) per row, [B]; 0 for a row whose mask is empty."""
    return (sequence_score(emissions, tags, mask, transitions, start, end)
            - log_partition(emissions, mask, transitions, start, end))


def viterbi_decode(emissions: Array, mask: Array, transitions: Array, start: Array,
                   end: Array) -> Array:
    """The highest-scoring tag sequence, [B, T] int32. Masked positions are not part of the
    chain and carry a neighbouring position's tag; callers ignore them."""
    emissions, transitions, start, end = _fp32(emissions, transitions, start, end)
    mask = jnp.asarray(mask, bool)
    rows, _, classes = emissions.shape
    identity = jnp.broadcast_to(jnp.arange(classes, dtype=jnp.int32), (rows, classes))

    def forward(carry, xs):
        delta, seen = carry
        on, emission = xs
        candidates = delta[:, :, None] + transitions[None]  # [B, previous, next]
        best_previous = jnp.argmax(candidates, axis=1).astype(jnp.int32)
        new = jnp.where(seen[:, None], jnp.max(candidates, axis=1), start[None]) + emission
        # A skipped position, or the chain's first, points every tag back to itself.
        pointer = jnp.where((on & seen)[:, None], best_previous, identity)
        return (jnp.where(on[:, None], new, delta), seen | on), pointer

    init = (jnp.zeros((rows, classes), jnp.float32), jnp.zeros(rows, bool))
    (delta, _), pointers = jax.lax.scan(forward, init, _time_major(mask, emissions))
    last = jnp.argmax(delta + end[None], axis=-1).astype(jnp.int32)

    def backward(tag, pointer):
        # `tag` is the tag at this position; the pointer gives the previous position's.
        return jnp.take_along_axis(pointer, tag[:, None], axis=1)[:, 0], tag

    _, path = jax.lax.scan(backward, last, pointers, reverse=True)
    return jnp.swapaxes(path, 0, 1)
