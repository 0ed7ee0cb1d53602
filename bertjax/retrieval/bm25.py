"""The lexical baseline: BM25 (Lucene's variant, k1 = 1.5, b = 0.75) with the `bm25s` package.

Text is lower-cased, split into words of two or more characters, stripped of English stop words
and Snowball-stemmed (PyStemmer), the usual set-up for a BM25 baseline in retrieval papers, so
the dense models are compared against a fair lexical ranker rather than a bag of raw tokens.

A corpus with no word left after that has nothing to rank by and is refused. A query with none
is answered, not refused: it scores 0 against every document (an evaluation counts what it
finds then as chance, as for any query sharing no word with the corpus), so one such query
among many does not stop the baseline.
"""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np

from bertjax.core import extras
from bertjax.core.errors import UserError


def libraries():
    """(bm25s, PyStemmer's Stemmer), the retrieval extra: loaded only for the --bm25 baseline."""
    purpose = "the BM25 baseline (--bm25)"
    return (extras.require("bm25s", "retrieval", purpose),
            extras.require("Stemmer", "retrieval", purpose))


class Bm25:
    def __init__(self, documents: Sequence[str], name: str = "the corpus"):
        bm25s, Stemmer = libraries()
        logging.getLogger("bm25s").setLevel(logging.WARNING)  # it logs each step at DEBUG

        if not documents:
            raise ValueError("BM25 needs at least one document")
        self._bm25s = bm25s
        self._stemmer = Stemmer.Stemmer("english")
        self.size = len(documents)
        self._retriever = bm25s.BM25()
        tokens = self._tokens(documents)
        if not any(tokens):
            raise UserError(f"BM25 has nothing to rank {name} by: every word of its "
                            f"{len(documents)} documents is an English stop word or a single "
                            "character")
        self._retriever.index(tokens, show_progress=False)

    def _tokens(self, texts: Sequence[str]):
        return self._bm25s.tokenize(list(texts), stopwords="en", stemmer=self._stemmer,
                                    return_ids=False, show_progress=False)

    def search(self, queries: Sequence[str], k: int) -> tuple[np.ndarray, np.ndarray]:
        """(scores [Q, k], document rows [Q, k]), best first; k at most the corpus size."""
        if not 1 <= k <= self.size:
            raise ValueError(f"k must be between 1 and the corpus size {self.size}, got {k}")
        ids, scores = self._retriever.retrieve(self._tokens(queries), k=k, show_progress=False,
                                               n_threads=1)
        return np.asarray(scores, np.float32), np.asarray(ids, np.int64)
