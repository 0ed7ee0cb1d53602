"""Scoring rankers on queries with known relevant documents: dense exact, dense approximate,
BM25 and dense + re-ranking, on the same queries and the same metrics (`metrics`)."""

from __future__ import annotations

from typing import Sequence

from bertjax.core.errors import UserError
from bertjax.retrieval import bm25 as bm25_baseline
from bertjax.retrieval import metrics
from bertjax.retrieval.bm25 import Bm25
from bertjax.retrieval.index import Index, embed_queries
from bertjax.retrieval.inputs import Query
from bertjax.retrieval.search import APPROXIMATE, EXACT, ranked

DEPTH = 10  # the metrics look at the top 10
COLUMNS = ("recall@1", "recall@10", "mrr@10", "ndcg@10")


def check_relevant(index: Index, queries: Sequence[Query]) -> None:
    known = {d.id for d in index.documents}
    missing = [i for q in queries for i in q.relevant if i not in known]
    if missing:
        raise UserError(f"{len(missing)} relevant document id(s) of the queries are not in "
                        f"{index.path} (the first: {missing[0]!r}); was it built from the same "
                        "corpus?")


def check_rankers(index: Index, *, bm25: bool = False) -> None:
    """Refuses, before any model loads, a ranker whose library is missing (the retrieval extra):
    the index's approximate graph (loaded and verified here) and the BM25 baseline."""
    if index.has_approximate:
        index.approximate_index()
    if bm25:
        bm25_baseline.libraries()


def evaluate(index: Index, queries: Sequence[Query], model, *, bm25: bool = False,
             cross_encoder=None, rerank_k: int = 50) -> dict:
    """{"methods": {name: metrics}, "approximate_recall": recall of the approximate top 10
    against the exact top 10 (None without an approximate index), "queries": count}."""
    check_relevant(index, queries)
    texts = [q.text for q in queries]
    relevant = [set(q.relevant) for q in queries]
    depth = min(DEPTH, index.size)
    vectors = embed_queries(index, model, texts)

    def ids(rows):
        return [[index.documents[r].id for r in row] for row in rows]

    results = {}
    exact_run = ranked(index, texts, vectors, depth, method=EXACT)
    results["dense exact"] = metrics.mean_metrics(ids(exact_run.rows), relevant)
    approximate_recall = None
    if index.has_approximate:
        approximate_run = ranked(index, texts, vectors, depth, method=APPROXIMATE)
        results["dense approximate"] = metrics.mean_metrics(ids(approximate_run.rows), relevant)
        approximate_recall = metrics.overlap_recall(approximate_run.rows, exact_run.rows)
    if bm25:
        _, rows = Bm25([d.text for d in index.documents],
                       f"the documents of {index.path}").search(texts, depth)
        results["BM25"] = metrics.mean_metrics(ids(rows.tolist()), relevant)
    if cross_encoder is not None:
        candidates = min(max(rerank_k, depth), index.size)
        reranked = ranked(index, texts, vectors, depth, method=EXACT,
                          cross_encoder=cross_encoder, rerank_k=candidates)
        results[f"dense exact + rerank@{candidates}"] = metrics.mean_metrics(
            ids(reranked.rows), relevant)
    return {"methods": results, "approximate_recall": approximate_recall,
            "queries": len(queries)}


def table(report: dict) -> str:
    width = max(len("method"), *(len(name) for name in report["methods"]))
    lines = [f"| {'method':<{width}} | " + " | ".join(COLUMNS) + " |",
             f"|{'-' * (width + 2)}|" + "|".join("-" * (len(c) + 2) for c in COLUMNS) + "|"]
    for name, values in report["methods"].items():
        lines.append(f"| {name:<{width}} | " + " | ".join(
            f"{values[c]:>{len(c)}.3f}" for c in COLUMNS) + " |")
    return "\n".join(lines)
