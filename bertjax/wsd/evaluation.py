"""Held-out accuracy of the 1-NN sense index against the most-frequent-sense baseline."""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

import numpy as np

from bertjax.wsd import wordnet
from bertjax.wsd.index import SenseIndex


@dataclasses.dataclass
class Evaluation:
    dataset: wordnet.Dataset
    nearest: list[bool]     # per held-out example: 1-NN right
    baseline: list[bool]    # per held-out example: most frequent sense right

    @staticmethod
    def accuracy(hits: Sequence[bool]) -> float:
        return float(np.mean(hits)) if len(hits) else float("nan")

    def per_lemma(self) -> dict[str, tuple[int, int, int, int]]:
        """lemma -> (senses, held-out examples, 1-NN right, baseline right)."""
        senses = collections.Counter(s.lemma for s in self.dataset.senses)
        rows = {lemma: [senses[lemma], 0, 0, 0] for lemma in self.dataset.lemmas}
        for e, hit, base in zip(self.dataset.test, self.nearest, self.baseline):
            row = rows[e.lemma]
            row[1:] = row[1] + 1, row[2] + hit, row[3] + base
        return {lemma: tuple(row) for lemma, row in rows.items()}


def evaluate(model, dataset: wordnet.Dataset, layers=-1) -> Evaluation:
    """Fits on the training examples, predicts the held-out ones."""
    index = SenseIndex.fit(model, dataset.train, layers)
    items = [(e.words, e.index, e.lemma) for e in dataset.test]
    ranked = index.rank_many(items)
    nearest = [r[0][0] == e.sense for r, e in zip(ranked, dataset.test)]
    baseline = [index.most_frequent(*item) == e.sense for item, e in zip(items, dataset.test)]
    return Evaluation(dataset, nearest, baseline)
