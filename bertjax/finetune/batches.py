"""Training batches of a fine-tuning run: a fresh permutation every epoch, fixed shapes, resumable.

The batch of step s is a pure function of (features, seed, s): epoch s // steps_per_epoch takes the
permutation numpy's PCG64 draws for (seed, epoch), and batch s % steps_per_epoch of it. A resumed
run therefore sees exactly the batches an uninterrupted one would, with no iterator state to save.
The last batch of an epoch is completed with zero-weight rows, so every example is used exactly
once per epoch. Each process builds only its own block of rows of every global batch.

With length buckets (bertjax.finetune.length_bucketing), the epoch's permutation is cut into
windows of many batches, each window grouped by bucket, and the batches of the epoch shuffled
again; each batch is cut to the bucket of its longest row. Still a pure function of (seed, epoch).
"""

from __future__ import annotations

import math
from typing import Iterator

import numpy as np

from bertjax.core.errors import UserError
from bertjax.core import length_buckets
from bertjax.finetune import length_bucketing
from bertjax.finetune.features import Arrays, take
from bertjax.parallel import partitioning


def process_share(mesh) -> tuple[int, int]:
    """(index, count): this process feeds block `index` of `count` equal row blocks of every
    global batch, as `partitioning.global_batch` expects."""
    share = partitioning.process_batch_slice(mesh)
    return share.index, share.count


# Batches a window groups by bucket: wide enough that few batches straddle two buckets.
WINDOW_BATCHES = 64


class EpochBatches:
    def __init__(self, arrays: Arrays, batch_size: int, seed: int, *, process_index: int = 0,
                 process_count: int = 1, buckets: tuple[int, ...] = ()):
        self.arrays = arrays
        self.rows = len(arrays["weight"])
        self.batch_size = batch_size
        self.seed = seed
        self.steps_per_epoch = math.ceil(self.rows / batch_size)
        self.lengths = length_bucketing.row_lengths(arrays) if len(buckets) > 1 else None
        self.buckets = tuple(buckets) if self.lengths is not None else ()
        self._plan: tuple[int, list] | None = None
        if batch_size % process_count:
            raise UserError(f"train.batch_size {batch_size} does not split over {process_count} "
                            "processes")
        local = batch_size // process_count
        self._local = slice(process_index * local, (process_index + 1) * local)

    def order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.rows)

    def epoch_batches(self, epoch: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """(row indices, valid) of every global batch of `epoch`, bucketed."""
        if self._plan is None or self._plan[0] != epoch:
            self._plan = (epoch, length_bucketing.sorted_batches(
                self.order(epoch), self.lengths, self.buckets, self.batch_size, WINDOW_BATCHES,
                np.random.default_rng([self.seed, epoch, 1])))
        return self._plan[1]

    def global_rows(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(row indices, valid) of the global batch that trains step `step` + 1 (0-based)."""
        epoch, index = divmod(step, self.steps_per_epoch)
        if self.buckets:
            return self.epoch_batches(epoch)[index]
        order = self.order(epoch)
        positions = np.arange(index * self.batch_size, (index + 1) * self.batch_size)
        valid = positions < self.rows
        return order[np.minimum(positions, self.rows - 1)], valid

    def length(self, step: int) -> int | None:
        """The token length of step `step` + 1's batch (the same on every process); None
        without buckets (every batch keeps its features' shape)."""
        if not self.buckets:
            return None
        rows, valid = self.global_rows(step)
        return length_buckets.fitting(int(self.lengths[rows[valid]].max()), self.buckets)

    def length_bound(self) -> int | None:
        """The longest batch any epoch can draw: the bucket of the longest row."""
        return length_buckets.fitting(int(self.lengths.max()), self.buckets) \
            if self.buckets else None

    def lengths_used(self) -> list[int]:
        """Every bucket some batch of the first epoch needs, longest first (later epochs draw
        other batches, so other buckets may follow)."""
        return sorted({self.length(step) for step in range(self.steps_per_epoch)}, reverse=True)

    def padding(self) -> tuple[float, float] | None:
        """Padding tokens per real token over the first epoch: (bucketed, unbucketed)."""
        if not self.buckets:
            return None
        return length_bucketing.padding_ratio(self.lengths, self.epoch_batches(0), self.buckets)

    def batch(self, step: int) -> Arrays:
        rows, valid = self.global_rows(step)
        arrays = take(self.arrays, rows[self._local], valid[self._local])
        return length_bucketing.cut(arrays, self.length(step)) if self.buckets else arrays

    def iterate(self, start_step: int) -> Iterator[Arrays]:
        step = start_step
        while True:
            yield self.batch(step)
            step += 1
