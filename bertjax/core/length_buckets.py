"""Length buckets: a few static lengths (multiples of `multiple`, capped at the longest allowed)
that batches of mixed-length rows are padded to, so a jitted function compiles a handful of
shapes, each once, and a short batch does not pay for the longest row. Fine-tuning's batches use
them too (bertjax.finetune.length_bucketing).

`run_bucketed` runs a function over many texts: rows sorted by length and cut into batches, each
padded to its bucket and its row count rounded up to a power of two (capped at `batch_size`).
Outputs come back in input order.
"""

from __future__ import annotations

import bisect
import math
import sys
from typing import Any, Callable, Sequence

import jax
import numpy as np
from tqdm import tqdm

Row = tuple[np.ndarray, np.ndarray]  # (token ids, segment ids), unpadded


# Fine-tuning and predict mode (train.bucket_multiple): few compiled shapes (4 at 128 tokens),
# since a run compiles a train step per shape and most runs are short.
DEFAULT_MULTIPLE = 32
# `bertjax.load(...).embed/encode`: a forward pass compiles fast and a corpus is embedded many
# times over, so finer buckets pay (16 lengths at 128 tokens; the figures, with 32 and with 8:
# docs/speed.md, sentence embeddings).
INFERENCE_MULTIPLE = 8


def bucket_lengths(multiple: int, limit: int) -> tuple[int, ...]:
    """The static lengths: multiples of `multiple` below `limit`, then `limit`; only `limit`
    when bucketing is off (`multiple` 0)."""
    if multiple <= 0:
        return (limit,)
    return tuple(range(multiple, limit, multiple)) + (limit,)


def fitting(length: int, buckets: tuple[int, ...]) -> int:
    """The smallest bucket that holds `length` tokens (the longest when none does)."""
    return buckets[min(bisect.bisect_left(buckets, length), len(buckets) - 1)]


def bucket_length(length: int, multiple: int, limit: int) -> int:
    return fitting(length, bucket_lengths(multiple, limit))


def bucket_rows(rows: int, batch_size: int) -> int:
    return min(batch_size, 1 << max(0, math.ceil(math.log2(max(rows, 1)))))


def run_bucketed(fn: Callable[[dict], Any], rows: Sequence[Row], *, batch_size: int,
                 limit: int, multiple: int = INFERENCE_MULTIPLE, pad_id: int = 0, min_rows: int = 1,
                 progress: bool | None = None) -> list[Any]:
    """`fn(batch)` on padded batches {input_ids, segment_ids, input_mask} [b, t] -> a pytree of
    arrays with b leading rows (b a multiple of `min_rows`: the mesh's batch shards); returns, per input row, that pytree's row (numpy, still padded
    along the length: slice with the row's own length)."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))
    results: list[Any] = [None] * len(rows)
    show = progress if progress is not None else len(rows) >= 2048 and sys.stderr.isatty()
    bar = None
    if show:
        bar = tqdm(total=len(rows), unit="text", file=sys.stderr, mininterval=1.0)
    for start in range(0, len(order), batch_size):
        chosen = order[start:start + batch_size]
        length = bucket_length(max(len(rows[i][0]) for i in chosen), multiple, limit)
        count = -(-bucket_rows(len(chosen), batch_size) // min_rows) * min_rows
        ids = np.full((count, length), pad_id, np.int32)
        segments = np.zeros((count, length), np.int32)
        mask = np.zeros((count, length), np.int32)
        for slot, i in enumerate(chosen):
            row_ids, row_segments = rows[i]
            ids[slot, :len(row_ids)] = row_ids
            segments[slot, :len(row_ids)] = row_segments
            mask[slot, :len(row_ids)] = 1
        out = jax.device_get(fn({"input_ids": ids, "segment_ids": segments, "input_mask": mask}))
        for slot, i in enumerate(chosen):
            results[i] = jax.tree.map(lambda leaf, s=slot: np.asarray(leaf[s]), out)
        if bar is not None:
            bar.update(len(chosen))
    if bar is not None:
        bar.close()
    return results
