"""Cross-encoder re-ranking: a first stage's candidates re-scored by a pair classifier.

The cross-encoder is a fine-tuned sentence-pair classification run (configs/finetune_pair.py)
trained on (query, passage, relevant or not) pairs; it reads `[CLS] query [SEP] passage [SEP]`
whole, so it sees the interactions a dual encoder's two separate vectors cannot, at the cost of
one model run per (query, candidate). A candidate's score is the probability of the positive
label (by default the run's second label, "1" of labels 0,1, as its F1 is), computed by the
run's own head through `bertjax.load(RUN).predict(queries, pairs=passages)`. Candidates of equal
score keep their first-stage order. The caller loads the run and passes the model in (retrieval
sits below the Python API).
"""

from __future__ import annotations

from typing import Sequence

import numpy as np

from bertjax.core.errors import UserError


class CrossEncoder:
    def __init__(self, model, positive_label: str = ""):
        """`model`: the run as `bertjax.load` returns it."""
        self.model = model
        path = model.path
        record = model.loaded.record
        labels = list((record.get("heads") or {}).get("labels") or [])
        if record.get("task") != "finetune_classification" or len(labels) < 2:
            raise UserError(f"{path} is not a fine-tuned classification run (task "
                            f"{record.get('task') or 'not recorded'}); re-ranking needs a "
                            "pair classifier such as configs/finetune_pair.py trains")
        if record.get("text_pairs") is False:
            raise UserError(f"{path} was trained on single texts, not (query, passage) pairs; "
                            "re-ranking needs a pair classifier such as "
                            "configs/finetune_pair.py trains")
        if positive_label and positive_label not in labels:
            raise UserError(f"the positive label {positive_label!r} is not one of {path}'s labels "
                            f"({', '.join(labels)})")
        self.positive = positive_label or labels[1]

    def score(self, queries: Sequence[str], passages: Sequence[str]) -> np.ndarray:
        """P(positive) of each (query, passage) pair."""
        if not queries:
            return np.zeros(0, np.float64)
        predictions = self.model.predict(list(queries), pairs=list(passages))
        return np.array([p["probabilities"][self.positive] for p in predictions], np.float64)

    def rerank(self, queries: Sequence[str], candidates: Sequence[Sequence[int]],
               texts: Sequence[str]) -> tuple[list[list[int]], list[list[float]]]:
        """Each query's candidate rows (best first) re-ordered by cross-encoder score, with the
        scores; one predict call for all pairs."""
        pairs = [(q, int(row)) for q, rows in zip(queries, candidates) for row in rows]
        scores = self.score([q for q, _ in pairs], [texts[row] for _, row in pairs])
        ranked, ranked_scores, start = [], [], 0
        for rows in candidates:
            own = scores[start:start + len(rows)]
            start += len(rows)
            order = np.argsort(-own, kind="stable")
            ranked.append([int(rows[i]) for i in order])
            ranked_scores.append([float(own[i]) for i in order])
        return ranked, ranked_scores
