"""A TF-IDF bag-of-words baseline: the document vectors that cosine similarity is compared on.

scikit-learn's `TfidfVectorizer()` when it is installed; otherwise the same weighting in numpy:
lowercased tokens of two or more word characters, raw counts times the smoothed idf
ln((1 + n) / (1 + df)) + 1, each row scaled to unit length.
"""

from __future__ import annotations

import collections
import re
from typing import Sequence

import numpy as np

_TOKEN = re.compile(r"(?u)\b\w\w+\b")  # TfidfVectorizer's default token_pattern


def vectors(documents: Sequence[str]) -> tuple[np.ndarray, str]:
    """(unit-length TF-IDF rows [N, V], which implementation made them)."""
    try:  # deferred and optional: scikit-learn is heavy, and numpy computes the same vectors
        from sklearn.feature_extraction.text import TfidfVectorizer
    except ImportError:
        return numpy_vectors(documents), "numpy"
    return TfidfVectorizer().fit_transform(documents).toarray(), "scikit-learn"


def numpy_vectors(documents: Sequence[str]) -> np.ndarray:
    counts = [collections.Counter(_TOKEN.findall(doc.lower())) for doc in documents]
    vocabulary = {term: i for i, term in enumerate(sorted(set().union(*counts)))}
    tf = np.zeros((len(documents), len(vocabulary)))
    for row, counter in enumerate(counts):
        for term, count in counter.items():
            tf[row, vocabulary[term]] = count
    df = (tf > 0).sum(axis=0)
    weighted = tf * (np.log((1 + len(documents)) / (1 + df)) + 1)
    norms = np.linalg.norm(weighted, axis=1, keepdims=True)
    return weighted / np.maximum(norms, np.finfo(np.float64).tiny)
