"""Which language each pretraining example comes from: exponentially smoothed sampling.

mBERT and XLM-R draw a language l with probability p_l = q_l^alpha / sum_k q_k^alpha, where q_l is
the language's share of the corpus (here: of its tokens, for batches; of its sentences, for the
vocabulary sample, whose tokens are not known yet). alpha = 1 keeps the corpus proportions, smaller
values raise the low-resource languages (mBERT 0.7, XLM-R 0.3, XLM 0.5).

The draw of global example g is a pure function of (seed, g): a keyed 64-bit hash of g, read as a
uniform number in [0, 1), against the cumulative probabilities. So a batch stays a function of
(seed, step), any example can be rebuilt alone, and resuming needs no sampler state.
"""

from __future__ import annotations

import numpy as np

from bertjax.core.errors import UserError

_LANGUAGE_STREAM = 3  # keeps the language draws apart from the example and mask streams


def smoothed_probabilities(counts: np.ndarray, alpha: float) -> np.ndarray:
    """p_l proportional to (n_l / sum n)^alpha; `counts` are the languages' sizes (tokens or
    sentences), every one positive."""
    counts = np.asarray(counts, np.float64)
    if counts.ndim != 1 or counts.size == 0 or not np.all(counts > 0):
        raise UserError(f"every language needs some text to sample from, got sizes {counts}")
    check_alpha(alpha)
    weights = (counts / counts.sum()) ** alpha
    return weights / weights.sum()


def check_alpha(alpha: float, name: str = "data.language_alpha") -> None:
    if isinstance(alpha, bool) or not isinstance(alpha, (int, float)) or not 0 < alpha <= 1:
        raise UserError(f"{name} must be in (0, 1] (1: corpus proportions; mBERT 0.7, XLM-R "
                        f"0.3), got {alpha!r}")


class LanguageSampler:
    """The language of each global example index, drawn with `probabilities`, keyed by `key`."""

    def __init__(self, probabilities: np.ndarray, key: list[int]):
        self.probabilities = np.asarray(probabilities, np.float64)
        self._cumulative = np.cumsum(self.probabilities)
        self._cumulative[-1] = 1.0  # rounding must never leave a draw past the last language
        self._key = np.random.SeedSequence([*key, _LANGUAGE_STREAM]).generate_state(1, np.uint64)[0]

    def languages_of(self, examples: np.ndarray) -> np.ndarray:
        """int64 language index of each global example index."""
        uniform = (_mix64(np.asarray(examples, np.uint64) ^ self._key) >> np.uint64(11)) \
            .astype(np.float64) * 2.0 ** -53
        return np.searchsorted(self._cumulative, uniform, side="right").astype(np.int64)


def _mix64(x: np.ndarray) -> np.ndarray:
    """splitmix64: a bijective, well-mixing hash of 64-bit integers (uint64 wraps around)."""
    with np.errstate(over="ignore"):
        x = x + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return x ^ (x >> np.uint64(31))
