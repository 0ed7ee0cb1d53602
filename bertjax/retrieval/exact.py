"""Exact nearest neighbours by inner product: a jitted matmul and `jax.lax.top_k`, chunked.

The corpus is scored a chunk of rows at a time and the queries a batch at a time, and each chunk's
top k is merged into a running top k, so no step holds more than a [query batch, chunk] score
matrix: a corpus far larger than device memory (read from a memory-mapped .npy) is searched the
same way as a small one. Chunks and query batches are padded to fixed shapes (padded rows score
-inf), so a search compiles one function whatever the corpus size. Ties keep the lower row first,
as a stable sort would.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np

CHUNK_ROWS = 65536
QUERY_ROWS = 1024


@functools.partial(jax.jit, static_argnames=("k",))
def _merge(best_scores, best_ids, queries, chunk, valid, offset, *, k: int):
    # HIGHEST: the GPU's default TF32 matmul would reorder near-ties against an fp32 reference.
    scores = jnp.matmul(queries, chunk.T, precision=jax.lax.Precision.HIGHEST)
    scores = jnp.where(jnp.arange(chunk.shape[0])[None, :] < valid, scores, -jnp.inf)
    chunk_scores, chunk_ids = jax.lax.top_k(scores, k)
    # The running best come first, so on a tie the earlier (lower) row wins.
    scores = jnp.concatenate([best_scores, chunk_scores], axis=1)
    ids = jnp.concatenate([best_ids, chunk_ids + offset], axis=1)
    top, where = jax.lax.top_k(scores, k)
    return top, jnp.take_along_axis(ids, where, axis=1)


def _padded(rows: np.ndarray, count: int) -> np.ndarray:
    out = np.zeros((count, rows.shape[1]), np.float32)
    out[:len(rows)] = rows
    return out


def search(vectors: np.ndarray, queries: np.ndarray, k: int, *, chunk_rows: int = CHUNK_ROWS,
           query_rows: int = QUERY_ROWS) -> tuple[np.ndarray, np.ndarray]:
    """The k highest inner products of each query with the rows of `vectors` ([N, H], any array
    that slices to numpy, e.g. a memmap): (scores [Q, k] fp32, row ids [Q, k] int64), best
    first. k must be between 1 and N."""
    count, dim = vectors.shape
    if not 1 <= k <= count:
        raise ValueError(f"k must be between 1 and the corpus size {count}, got {k}")
    queries = np.asarray(queries, np.float32)
    if queries.ndim != 2 or queries.shape[1] != dim:
        raise ValueError(f"queries of shape {queries.shape} for vectors of width {dim}")
    # Chunks no larger than the corpus needs (rounded to 8), and never fewer rows than k.
    chunk = max(k, min(chunk_rows, -(-count // 8) * 8))
    batch = min(query_rows, 1 << max(0, (len(queries) - 1).bit_length()))
    batches = [_padded(queries[i:i + batch], batch) for i in range(0, len(queries), batch)]
    best = [(jnp.full((batch, k), -jnp.inf, jnp.float32), jnp.full((batch, k), -1, jnp.int32))
            for _ in batches]
    for start in range(0, count, chunk):
        rows = np.asarray(vectors[start:start + chunk], np.float32)
        placed = jax.device_put(_padded(rows, chunk))
        for b, query_batch in enumerate(batches):
            best[b] = _merge(*best[b], query_batch, placed, len(rows), start, k=k)
    if not batches:
        return np.zeros((0, k), np.float32), np.zeros((0, k), np.int64)
    scores = np.concatenate([np.asarray(s) for s, _ in best])[:len(queries)]
    ids = np.concatenate([np.asarray(i) for _, i in best])[:len(queries)]
    return scores, ids.astype(np.int64)
