"""Document similarity against human judgements: the Lee et al. (2005) corpus (bertjax.evaluation.lee),
scored by `python -m bertjax.evaluate similarity` (bertjax.cli.similarity).

For each pooling, the model's cosine similarity of the two documents of every one of the 1,225
pairs is correlated with the pair's mean human rating (Spearman, and Pearson for reference); a
TF-IDF cosine baseline (bertjax.evaluation.tfidf) is scored on the same pairs. Documents longer
than the model's limit (or --max-seq-len) are truncated, and counted.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bertjax.evaluation import correlation, lee, tfidf


@dataclasses.dataclass(frozen=True)
class Score:
    method: str
    spearman: float
    pearson: float


def pair_cosines(vectors: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """Cosine of the rows of each pair [P, 2] of `vectors` [N, H] -> [P]."""
    vectors = np.asarray(vectors, np.float64)
    unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    return np.sum(unit[pairs[:, 0]] * unit[pairs[:, 1]], axis=1)


def score(method: str, cosines: np.ndarray, ratings: np.ndarray) -> Score:
    return Score(method, correlation.spearman(cosines, ratings),
                 correlation.pearson(cosines, ratings))


def model_scores(model, corpus: lee.LeeCorpus, poolings, layers="all", standardize=None
                 ) -> tuple[list[Score], int]:
    """(one Score per pooling, how many documents were truncated); vectors standardised by the
    `standardize` statistics when given."""
    scores, truncated = [], 0
    for pooling in poolings:
        before = model.truncated  # the same documents are cut for every pooling
        vectors = model.embed(corpus.documents, pooling, layers=layers, standardize=standardize)
        truncated = model.truncated - before
        method = f"model, {pooling} pooling" + (f", {standardize.method}" if standardize else "")
        scores.append(score(method, pair_cosines(vectors, corpus.pairs),
                            corpus.ratings))
    return scores, truncated


def baseline_score(corpus: lee.LeeCorpus) -> Score:
    vectors, implementation = tfidf.vectors(corpus.documents)
    return score(f"TF-IDF cosine ({implementation})", pair_cosines(vectors, corpus.pairs),
                 corpus.ratings)
