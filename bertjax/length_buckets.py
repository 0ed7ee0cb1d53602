"""Running a jitted function over many texts of mixed length with few compilations.

Rows are sorted by length and cut into batches; each batch is padded to a bucket: its longest row
rounded up to a multiple of `multiple` (capped at `limit`), and its row count rounded up to a power
of two (capped at `batch_size`). So a corpus compiles a handful of shapes, each once (jit caches
them), and a short batch does not pay for the longest text. Outputs come back in input order.
"""

from __future__ import annotations

import math
import sys
from typing import Any, Callable, Sequence

import jax
import numpy as np

Row = tuple[np.ndarray, np.ndarray]  # (token ids, segment ids), unpadded


def bucket_length(length: int, multiple: int, limit: int) -> int:
    return min(limit, max(multiple, math.ceil(length / multiple) * multiple))


def bucket_rows(rows: int, batch_size: int) -> int:
    return min(batch_size, 1 << max(0, math.ceil(math.log2(max(rows, 1)))))


def run_bucketed(fn: Callable[[dict], Any], rows: Sequence[Row], *, batch_size: int,
                 limit: int, multiple: int = 8, pad_id: int = 0, min_rows: int = 1,
                 progress: bool | None = None) -> list[Any]:
    """`fn(batch)` on padded batches {input_ids, segment_ids, input_mask} [b, t] -> a pytree of
    arrays with b leading rows (b a multiple of `min_rows`: the mesh's batch shards); returns, per input row, that pytree's row (numpy, still padded
    along the length: slice with the row's own length)."""
    order = sorted(range(len(rows)), key=lambda i: len(rows[i][0]))
    results: list[Any] = [None] * len(rows)
    show = progress if progress is not None else len(rows) >= 2048 and sys.stderr.isatty()
    bar = None
    if show:
        from tqdm import tqdm

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
