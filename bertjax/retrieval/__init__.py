"""Retrieval with a trained encoder: a vector index over a corpus, exact and approximate search,
BM25 for comparison, cross-encoder re-ranking, and the ranking metrics that compare them; and a
real retrieval set to train and evaluate on (`wiki_pairs`).

    python -m bertjax.index build --model PATH --corpus docs.jsonl --output INDEX
    python -m bertjax.index search --index INDEX --queries q.txt --k 10 [--rerank RUN]
    python -m bertjax.index evaluate --index INDEX --queries q.jsonl --bm25 [--rerank RUN]
    python -m bertjax.retrieval.wiki_pairs --output DIR
"""
