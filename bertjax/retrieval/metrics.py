"""Ranking metrics with binary relevance, averaged over queries.

Each query brings its ranking (document ids, best first) and the set of ids relevant to it.
Recall@k is the share of a query's relevant documents found in its top k (1.0 or 0.0 when one
document is relevant); MRR@k the reciprocal rank of the first relevant document in the top k
(0 when none is); nDCG@k the discounted gain of the top k (gain 1 for a relevant document at rank
r, discounted by log2(r + 1)) over that of the ideal ranking, which puts min(k, #relevant)
relevant documents first.
"""

from __future__ import annotations

import math
from typing import Collection, Sequence

Ranking = Sequence[str]


def recall_at(ranking: Ranking, relevant: Collection[str], k: int) -> float:
    return len(set(ranking[:k]) & set(relevant)) / len(relevant)


def reciprocal_rank(ranking: Ranking, relevant: Collection[str], k: int) -> float:
    for rank, doc in enumerate(ranking[:k], start=1):
        if doc in relevant:
            return 1.0 / rank
    return 0.0


def ndcg_at(ranking: Ranking, relevant: Collection[str], k: int) -> float:
    gain = sum(1.0 / math.log2(rank + 1)
               for rank, doc in enumerate(ranking[:k], start=1) if doc in relevant)
    ideal = sum(1.0 / math.log2(rank + 1) for rank in range(1, min(k, len(relevant)) + 1))
    return gain / ideal


def mean_metrics(rankings: Sequence[Ranking], relevant: Sequence[Collection[str]]
                 ) -> dict[str, float]:
    """Recall@1, Recall@10, MRR@10 and nDCG@10 over the queries (each with at least one relevant
    document)."""
    if len(rankings) != len(relevant):
        raise ValueError(f"{len(rankings)} rankings for {len(relevant)} relevance sets")
    if not rankings:
        raise ValueError("no queries to score")
    if any(not r for r in relevant):
        raise ValueError("every query needs at least one relevant document")
    count = len(rankings)
    return {
        "recall@1": sum(recall_at(r, g, 1) for r, g in zip(rankings, relevant)) / count,
        "recall@10": sum(recall_at(r, g, 10) for r, g in zip(rankings, relevant)) / count,
        "mrr@10": sum(reciprocal_rank(r, g, 10) for r, g in zip(rankings, relevant)) / count,
        "ndcg@10": sum(ndcg_at(r, g, 10) for r, g in zip(rankings, relevant)) / count,
    }


def overlap_recall(approximate: Sequence[Sequence[int]], exact: Sequence[Sequence[int]]) -> float:
    """Recall of an approximate search against the exact one: the share of the exact top-k that
    the approximate top-k also holds, over all queries."""
    found = sum(len(set(a) & set(e)) for a, e in zip(approximate, exact))
    total = sum(len(e) for e in exact)
    return found / total if total else 1.0
