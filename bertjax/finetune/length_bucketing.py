"""Fine-tuning batches cut to a few static lengths (bertjax.core.length_buckets) instead of
max_seq_len.

Features are built padded to max_seq_len; a batch whose longest row is shorter is sliced along the
token axis to the smallest bucket (a multiple of `train.bucket_multiple`, at most max_seq_len)
that holds it, so a batch of 25-token sentences costs a 32-token step, not a 128-token one. Each
bucket is one static shape: XLA compiles it once, and there are at most max_seq_len / multiple of
them. Padding is masked out of attention, losses and metrics, so a row's outputs do not depend on
how much of it is cut (within fp32 rounding).
"""

from __future__ import annotations

import jax
import numpy as np

from bertjax.core import length_buckets
from bertjax.finetune.features import Arrays
from bertjax.finetune.schema import TOKEN_KEYS


def row_lengths(arrays: Arrays) -> np.ndarray | None:
    """Tokens in each row, or None for features without one token axis (a dual encoder's query
    and document rows), which are never cut."""
    if "input_mask" not in arrays:
        return None
    mask = arrays["input_mask"]
    # The last real position + 1 (not the count of ones): a row is cut after it, never inside.
    real = mask.astype(bool)
    last = mask.shape[1] - np.argmax(real[:, ::-1], axis=1)
    return np.where(real.any(axis=1), last, 1).astype(np.int64)


def cut(arrays: Arrays, length: int) -> Arrays:
    """The batch with its token axis cut to `length`."""
    return {key: value[:, :length] if key in TOKEN_KEYS else value
            for key, value in arrays.items()}


def cut_shapes(shapes: dict, length: int) -> dict:
    """Batch ShapeDtypeStructs with their token axis cut to `length` (shardings kept)."""
    return {key: jax.ShapeDtypeStruct((v.shape[0], length, *v.shape[2:]), v.dtype,
                                      sharding=v.sharding) if key in TOKEN_KEYS else v
            for key, v in shapes.items()}


def padding_ratio(lengths: np.ndarray, batches: list[tuple[np.ndarray, np.ndarray]],
                  buckets: tuple[int, ...]) -> tuple[float, float]:
    """(padding tokens per real token with these buckets, and padded to the longest bucket) over
    `batches` of (rows, valid); a batch's placeholder rows count as padding."""
    real = padded = 0
    for rows, valid in batches:
        longest = int(lengths[rows[valid]].max()) if valid.any() else 1
        real += int(lengths[rows[valid]].sum())
        padded += len(rows) * length_buckets.fitting(longest, buckets)
    full = sum(len(rows) for rows, _ in batches) * buckets[-1]
    return (padded - real) / max(real, 1), (full - real) / max(real, 1)


def sorted_batches(order: np.ndarray, lengths: np.ndarray, buckets: tuple[int, ...],
                   batch_size: int, window_batches: int, rng: np.random.Generator
                   ) -> list[tuple[np.ndarray, np.ndarray]]:
    """Batches of (rows, valid) from `order`: each window of `window_batches` batches grouped by
    bucket, then all batches in a random order (so length does not follow the step). Grouped by
    bucket, not sorted by length: rows of one bucket keep their shuffled order, so a batch is as
    random a draw as the bucket allows, and the same rows do not meet again every epoch. Only
    the epoch's last batch is short; its missing rows are placeholders (valid False)."""
    bucket_of = np.searchsorted(np.asarray(buckets), lengths)
    window = batch_size * window_batches
    batches = []
    for start in range(0, len(order), window):
        part = order[start:start + window]
        part = part[np.argsort(bucket_of[part], kind="stable")]
        for first in range(0, len(part), batch_size):
            rows = part[first:first + batch_size]
            valid = np.ones(batch_size, bool)
            valid[len(rows):] = False
            batches.append((np.concatenate([rows, np.full(batch_size - len(rows), rows[0])]),
                            valid))
    return [batches[i] for i in rng.permutation(len(batches))]
