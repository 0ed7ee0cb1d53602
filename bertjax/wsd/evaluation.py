"""Held-out accuracy of the 1-NN sense index against the most-frequent-sense baseline."""

from __future__ import annotations

import collections
import dataclasses
import re
from typing import Iterable, Sequence

import numpy as np

from bertjax.vectors.standardizer import Standardizer
from bertjax.wsd import wordnet
from bertjax.wsd.index import SenseIndex

_WORDS = re.compile(r"[a-z]+")


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


    def by_frequency(self, frequency: dict[str, int]) -> dict[str, tuple[int, int, int, int]]:
        """"frequent" / "rare" (the lemmas at or above / below the median of `frequency`, a
        lemma's count in a reference corpus) -> (lemmas, held-out examples, 1-NN right,
        baseline right)."""
        counts = {lemma: frequency.get(lemma, 0) for lemma in self.dataset.lemmas}
        median = float(np.median(list(counts.values()))) if counts else 0.0
        rows = {"frequent": [set(), 0, 0, 0], "rare": [set(), 0, 0, 0]}
        for e, hit, base in zip(self.dataset.test, self.nearest, self.baseline):
            row = rows["frequent" if counts[e.lemma] >= median else "rare"]
            row[0].add(e.lemma)
            row[1:] = row[1] + 1, row[2] + hit, row[3] + base
        return {name: (len(row[0]), *row[1:]) for name, row in rows.items()}


def corpus_frequencies(texts: Iterable[str], lemmas: Iterable[str]) -> dict[str, int]:
    """How often each lemma occurs as a lower-cased word (its base form only) in `texts`."""
    wanted = set(lemmas)
    counts = collections.Counter(word for text in texts for word in
                                 _WORDS.findall(text.lower()) if word in wanted)
    return {lemma: counts[lemma] for lemma in wanted}


def evaluate(model, dataset: wordnet.Dataset, layers=-1,
             standardizer: Standardizer | None = None) -> Evaluation:
    """Fits on the training examples (word vectors standardised by `standardizer`, if given),
    predicts the held-out ones."""
    index = SenseIndex.fit(model, dataset.train, layers, standardizer)
    items = [(e.words, e.index, e.lemma) for e in dataset.test]
    ranked = index.rank_many(items)
    nearest = [r[0][0] == e.sense for r, e in zip(ranked, dataset.test)]
    baseline = [index.most_frequent(*item) == e.sense for item, e in zip(items, dataset.test)]
    return Evaluation(dataset, nearest, baseline)
