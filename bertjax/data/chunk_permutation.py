"""The order an epoch visits chunks in: a keyed pseudo-random permutation, computed per index."""

from __future__ import annotations

import numpy as np


class Permutation:
    """A keyed pseudo-random permutation of range(n), evaluated per index in O(1) memory.

    A balanced 4-round Feistel network on the smallest even bit width covering n, with cycle
    walking (values >= n are encrypted again until they fall below n; the domain is < 4n, so
    that takes under 4 rounds on average). A stored np.random permutation would cost 8 bytes a
    chunk per phase, per worker, and O(n) time at every epoch.
    """

    def __init__(self, n: int, key: list[int], rounds: int = 4):
        self.n = n
        self.half = max(1, (max(n - 1, 1).bit_length() + 1) // 2)
        self.keys = np.random.SeedSequence(key).generate_state(rounds, np.uint64)

    def _encrypt(self, x: np.ndarray) -> np.ndarray:
        mask = np.uint64((1 << self.half) - 1)
        left, right = x >> np.uint64(self.half), x & mask
        for key in self.keys:
            left, right = right, left ^ (_mix64(right ^ key) & mask)
        return (left << np.uint64(self.half)) | right

    def __call__(self, index: np.ndarray) -> np.ndarray:
        out = self._encrypt(np.asarray(index, np.uint64))
        outside = out >= self.n
        while outside.any():
            out[outside] = self._encrypt(out[outside])
            outside = out >= self.n
        return out.astype(np.int64)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer: a cheap, well-mixing round function (uint64 wraps around)."""
    x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))
