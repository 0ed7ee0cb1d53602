"""How anisotropic a set of contextual token embeddings is: three measures of one layer.

- baseline: the mean cosine between the embeddings of random tokens from different sentences.
  Isotropic vectors give ~0; contextual embeddings give far more (Ethayarajh 2019, "How
  Contextual are Contextualized Word Representations?"), so raw cosines must be read against it.
- self-similarity: the mean cosine between the embeddings of one word in different sentences,
  averaged over words seen in at least two sentences (Ethayarajh's measure of how contextual a
  layer is; the higher above the baseline, the more a word keeps its vector across contexts).
- the share of the total variance in the 1 and 10 dimensions of largest variance ("rogue
  dimensions", Timkey & van Schijndel 2021): 1/H and 10/H for evenly spread vectors.

Random choices come from a seeded generator: the same inputs give the same figures.
"""

from __future__ import annotations

import dataclasses

import numpy as np

PAIRS = 4000          # random token pairs for the baseline
CONTEXTS = 10         # occurrences (each in another sentence) per word for self-similarity
WORDS = 500           # words sampled for self-similarity


@dataclasses.dataclass(frozen=True)
class Geometry:
    baseline: float          # mean cosine of random tokens from different sentences
    self_similarity: float   # mean cosine of a word across its contexts
    words: int               # words self-similarity averages over
    top1_variance: float     # share of the variance in the largest-variance dimension
    top10_variance: float    # ... in the ten largest


def _unit(vectors: np.ndarray) -> np.ndarray:
    vectors = np.asarray(vectors, np.float64)
    return vectors / np.maximum(np.linalg.norm(vectors, axis=-1, keepdims=True), 1e-12)


def random_pair_cosine(vectors: np.ndarray, sentences: np.ndarray, rng: np.random.Generator,
                       pairs: int = PAIRS) -> float:
    """Mean cosine of `pairs` random token pairs from different sentences (nan without two)."""
    if len(np.unique(sentences)) < 2:
        return float("nan")
    unit = _unit(vectors)
    left, right = rng.integers(0, len(unit), (2, pairs * 2))
    keep = sentences[left] != sentences[right]
    left, right = left[keep][:pairs], right[keep][:pairs]
    return float(np.mean(np.sum(unit[left] * unit[right], axis=1)))


def self_similarity(vectors: np.ndarray, sentences: np.ndarray, words: np.ndarray,
                    rng: np.random.Generator) -> tuple[float, int]:
    """(mean over words of the mean pairwise cosine of its occurrences in different sentences,
    how many words); `words` [N] names each row's word, -1 for rows that are not one."""
    unit = _unit(vectors)
    occurrences: dict[int, dict[int, int]] = {}
    for row in np.flatnonzero(words >= 0):
        occurrences.setdefault(int(words[row]), {}).setdefault(int(sentences[row]), row)
    eligible = [list(by_sentence.values()) for by_sentence in occurrences.values()
                if len(by_sentence) >= 2]
    if not eligible:
        return float("nan"), 0
    if len(eligible) > WORDS:
        eligible = [eligible[i] for i in rng.choice(len(eligible), WORDS, replace=False)]
    means = []
    for rows in eligible:
        chosen = unit[rows[:CONTEXTS]]
        cosines = chosen @ chosen.T
        n = len(chosen)
        means.append((cosines.sum() - np.trace(cosines)) / (n * (n - 1)))
    return float(np.mean(means)), len(eligible)


def top_variance_share(vectors: np.ndarray, k: int) -> float:
    variance = np.sort(np.var(np.asarray(vectors, np.float64), axis=0))[::-1]
    return float(variance[:k].sum() / max(variance.sum(), 1e-30))


def measure(vectors: np.ndarray, sentences: np.ndarray, words: np.ndarray,
            seed: int = 0) -> Geometry:
    """The three measures of token vectors [N, H], row i from sentence `sentences[i]`."""
    rng = np.random.default_rng(seed)
    baseline = random_pair_cosine(vectors, sentences, rng)
    similarity, count = self_similarity(vectors, sentences, words, rng)
    return Geometry(baseline, similarity, count, top_variance_share(vectors, 1),
                    top_variance_share(vectors, 10))
