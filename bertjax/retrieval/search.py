"""One search over an index: dense (exact or approximate) first stage, optional re-ranking.

The commands (`cli`) and the evaluation (`evaluation`) both rank through `ranked`, so what is
evaluated is what `search` returns.
"""

from __future__ import annotations

import dataclasses
import sys

import numpy as np

from bertjax.core.errors import UserError
from bertjax.retrieval import approximate, exact
from bertjax.retrieval.index import HNSW, Index, damaged

EXACT, APPROXIMATE = "exact", "approximate"


@dataclasses.dataclass
class Ranked:
    rows: list[list[int]]             # per query, document rows best first
    scores: list[list[float]]         # the score each row was ranked by
    first_stage: list[list[float]] | None = None  # with re-ranking: the dense scores


def clamped(k: int, size: int, what: str = "--k") -> int:
    """k, or the corpus size with a warning when k is larger (every document is then returned,
    which is what a k that large asks for)."""
    if k < 1:
        raise UserError(f"{what} must be at least 1, got {k}")
    if k > size:
        print(f"bertjax: warning: {what} {k} is more than the {size} documents in the index; "
              f"returning {size} per query", file=sys.stderr)
        return size
    return k


def dense(index: Index, query_vectors: np.ndarray, k: int, method: str = EXACT
          ) -> tuple[np.ndarray, np.ndarray]:
    if method == APPROXIMATE:
        graph = index.approximate_index()
        try:
            return approximate.search(graph, query_vectors, k)
        except approximate.FaissError as e:
            raise damaged(index.path, f"FAISS failed searching {HNSW} ({e})") from None
    return exact.search(index.vectors, query_vectors, k)


def ranked(index: Index, query_texts: list[str], query_vectors: np.ndarray, k: int, *,
           method: str = EXACT, cross_encoder=None, rerank_k: int = 0) -> Ranked:
    """The top k per query (k already clamped); with `cross_encoder`, the dense top `rerank_k`
    (>= k) re-scored by it and cut to k."""
    depth = rerank_k if cross_encoder is not None else k
    scores, rows = dense(index, query_vectors, depth, method)
    if cross_encoder is None:
        return Ranked(rows.tolist(), scores.tolist())
    dense_score = [dict(zip(r.tolist(), s.tolist())) for r, s in zip(rows, scores)]
    reranked, rerank_scores = cross_encoder.rerank(query_texts, rows.tolist(),
                                                   [d.text for d in index.documents])
    return Ranked([r[:k] for r in reranked], [s[:k] for s in rerank_scores],
                  [[dense_score[q][row] for row in r[:k]] for q, r in enumerate(reranked)])
