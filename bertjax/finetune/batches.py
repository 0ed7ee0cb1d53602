"""Training batches of a fine-tuning run: a fresh permutation every epoch, fixed shapes, resumable.

The batch of step s is a pure function of (features, seed, s): epoch s // steps_per_epoch takes the
permutation numpy's PCG64 draws for (seed, epoch), and batch s % steps_per_epoch of it. A resumed
run therefore sees exactly the batches an uninterrupted one would, with no iterator state to save.
The last batch of an epoch is completed with zero-weight rows, so every example is used exactly
once per epoch. Each process builds only its own block of rows of every global batch.
"""

from __future__ import annotations

import math
from typing import Iterator

import numpy as np

from bertjax.errors import UserError
from bertjax.finetune.features import Arrays, take
from bertjax.parallel import partitioning


def process_share(mesh) -> tuple[int, int]:
    """(index, count): this process feeds block `index` of `count` equal row blocks of every
    global batch, as `partitioning.global_batch` expects."""
    share = partitioning.process_batch_slice(mesh)
    return share.index, share.count


class EpochBatches:
    def __init__(self, arrays: Arrays, batch_size: int, seed: int, *, process_index: int = 0,
                 process_count: int = 1):
        self.arrays = arrays
        self.rows = len(arrays["weight"])
        self.batch_size = batch_size
        self.seed = seed
        self.steps_per_epoch = math.ceil(self.rows / batch_size)
        if batch_size % process_count:
            raise UserError(f"train.batch_size {batch_size} does not split over {process_count} "
                            "processes")
        local = batch_size // process_count
        self._local = slice(process_index * local, (process_index + 1) * local)

    def order(self, epoch: int) -> np.ndarray:
        return np.random.default_rng([self.seed, epoch]).permutation(self.rows)

    def global_rows(self, step: int) -> tuple[np.ndarray, np.ndarray]:
        """(row indices, valid) of the global batch that trains step `step` + 1 (0-based)."""
        epoch, index = divmod(step, self.steps_per_epoch)
        order = self.order(epoch)
        positions = np.arange(index * self.batch_size, (index + 1) * self.batch_size)
        valid = positions < self.rows
        return order[np.minimum(positions, self.rows - 1)], valid

    def batch(self, step: int) -> Arrays:
        rows, valid = self.global_rows(step)
        return take(self.arrays, rows[self._local], valid[self._local])

    def iterate(self, start_step: int) -> Iterator[Arrays]:
        step = start_step
        while True:
            yield self.batch(step)
            step += 1
