"""Evaluation metrics of the fine-tuning tasks, in plain numpy, on the host.

Classification: accuracy, Matthews correlation (multi-class, as sklearn computes it), F1 (binary,
of one positive label, and macro). Regression: Pearson and Spearman (ties get average ranks, as
scipy's). Tagging: entity-level precision/recall/F1 with seqeval's default semantics. Extractive QA:
the official SQuAD v1.1 exact match and F1.

Entity spans follow seqeval's default (non-strict) mode: a chunk ends before B-, before O and
before a tag of another type; a chunk begins at B-, and also at an I- that follows O or a tag of
another type (an "invalid" I- start counts as the beginning of an entity, it is not dropped).
"""

from __future__ import annotations

import collections
import re
import string
from typing import Iterable, Sequence

import numpy as np

Span = tuple[str, int, int]  # (type, first index, last index), inclusive


def accuracy(labels: Sequence[int], predictions: Sequence[int]) -> float:
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    return float(np.mean(labels == predictions)) if labels.size else 0.0


def confusion_matrix(labels: Sequence[int], predictions: Sequence[int],
                     num_classes: int) -> np.ndarray:
    """[true, predicted] counts."""
    matrix = np.zeros((num_classes, num_classes), np.int64)
    np.add.at(matrix, (np.asarray(labels, int), np.asarray(predictions, int)), 1)
    return matrix


def matthews_corrcoef(labels: Sequence[int], predictions: Sequence[int],
                      num_classes: int) -> float:
    """Gorodkin's multi-class MCC (sklearn's formula); 0 where it is undefined."""
    c = confusion_matrix(labels, predictions, num_classes).astype(np.float64)
    true_sums, predicted_sums = c.sum(axis=1), c.sum(axis=0)
    n, correct = c.sum(), np.trace(c)
    covariance = correct * n - true_sums @ predicted_sums
    spread = (n * n - predicted_sums @ predicted_sums) * (n * n - true_sums @ true_sums)
    return float(covariance / np.sqrt(spread)) if spread > 0 else 0.0


def f1_of_class(labels: Sequence[int], predictions: Sequence[int], positive: int) -> float:
    labels, predictions = np.asarray(labels), np.asarray(predictions)
    tp = int(np.sum((predictions == positive) & (labels == positive)))
    predicted, actual = int(np.sum(predictions == positive)), int(np.sum(labels == positive))
    return _f1(tp, predicted, actual)


def macro_f1(labels: Sequence[int], predictions: Sequence[int]) -> float:
    """The mean F1 over the labels present in the gold labels or the predictions (sklearn's
    average="macro"): a class absent from both is left out, not counted as 0."""
    present = np.union1d(np.asarray(labels, int), np.asarray(predictions, int))
    if not present.size:
        return 0.0
    return float(np.mean([f1_of_class(labels, predictions, k) for k in present]))


def _f1(true_positives: int, predicted: int, actual: int) -> float:
    if true_positives == 0:
        return 0.0
    precision, recall = true_positives / predicted, true_positives / actual
    return 2 * precision * recall / (precision + recall)


def pearson(x: Sequence[float], y: Sequence[float]) -> float:
    """Pearson's r; 0 when either side is constant (no linear relation can be measured)."""
    x, y = np.asarray(x, np.float64), np.asarray(y, np.float64)
    dx, dy = x - x.mean(), y - y.mean()
    denominator = np.sqrt((dx @ dx) * (dy @ dy))
    return float(np.clip(dx @ dy / denominator, -1.0, 1.0)) if denominator > 0 else 0.0


def average_ranks(values: Sequence[float]) -> np.ndarray:
    """1-based ranks; tied values share the mean of the ranks they span."""
    values = np.asarray(values, np.float64)
    order = np.argsort(values, kind="mergesort")
    ranks = np.empty(len(values), np.float64)
    sorted_values = values[order]
    start = 0
    for end in range(1, len(values) + 1):
        if end == len(values) or sorted_values[end] != sorted_values[start]:
            ranks[order[start:end]] = (start + end + 1) / 2.0
            start = end
    return ranks


def spearman(x: Sequence[float], y: Sequence[float]) -> float:
    return pearson(average_ranks(x), average_ranks(y))


# --- entities -------------------------------------------------------------------------------------

def _split_tag(tag: str) -> tuple[str, str]:
    if tag == "O" or "-" not in tag:
        return "O", ""
    prefix, kind = tag.split("-", 1)
    return prefix, kind


def entity_spans(tags: Sequence[str]) -> list[Span]:
    """Entities in a tag sequence (BIO, also tolerating E-/S-), seqeval's default semantics."""
    spans: list[Span] = []
    begin, previous_prefix, previous_kind = None, "O", ""
    for i, tag in enumerate(list(tags) + ["O"]):
        prefix, kind = _split_tag(tag)
        ends = (previous_prefix in ("E", "S")
                or (previous_prefix in ("B", "I") and prefix in ("B", "S", "O"))
                or (previous_prefix != "O" and kind != previous_kind))
        if begin is not None and ends:
            spans.append((previous_kind, begin, i - 1))
            begin = None
        starts = (prefix in ("B", "S")
                  or (prefix in ("I", "E") and (previous_prefix in ("E", "S", "O")
                                                or kind != previous_kind)))
        if starts:
            begin = i
        previous_prefix, previous_kind = prefix, kind
    return spans


def entity_scores(gold: Iterable[Sequence[str]], predicted: Iterable[Sequence[str]]) -> dict:
    """Micro precision / recall / F1 over exact (type, start, end) matches, and F1 per type."""
    hits, n_predicted, n_gold = collections.Counter(), collections.Counter(), collections.Counter()
    for gold_tags, predicted_tags in zip(gold, predicted, strict=True):
        gold_spans = set(entity_spans(gold_tags))
        predicted_spans = set(entity_spans(predicted_tags))
        for span in gold_spans:
            n_gold[span[0]] += 1
        for span in predicted_spans:
            n_predicted[span[0]] += 1
            hits[span[0]] += span in gold_spans
    tp, p, g = sum(hits.values()), sum(n_predicted.values()), sum(n_gold.values())
    return {
        "entity_precision": tp / p if p else 0.0,
        "entity_recall": tp / g if g else 0.0,
        "entity_f1": _f1(tp, p, g),
        "entity_f1_by_type": {kind: _f1(hits[kind], n_predicted[kind], n_gold[kind])
                              for kind in sorted(n_gold | n_predicted)},
    }


# --- SQuAD v1.1 (the official evaluate-v1.1.py, reimplemented) -----------------------------------

_ARTICLES = re.compile(r"\b(a|an|the)\b")
_PUNCTUATION = set(string.punctuation)


def normalize_answer(text: str) -> str:
    """Lowercase, drop punctuation, drop the articles a/an/the, collapse whitespace."""
    text = "".join(ch for ch in text.lower() if ch not in _PUNCTUATION)
    return " ".join(_ARTICLES.sub(" ", text).split())


def exact_match(prediction: str, truth: str) -> float:
    return float(normalize_answer(prediction) == normalize_answer(truth))


def token_f1(prediction: str, truth: str) -> float:
    predicted, gold = normalize_answer(prediction).split(), normalize_answer(truth).split()
    common = sum((collections.Counter(predicted) & collections.Counter(gold)).values())
    return _f1(common, len(predicted), len(gold))


def squad_scores(answers: dict[str, Sequence[str]], predictions: dict[str, str]) -> dict:
    """Mean EM and F1 (in %), each the max over an example's gold answers; a question without a
    prediction scores 0, as in the official script."""
    em = f1 = 0.0
    for qid, truths in answers.items():
        prediction = predictions.get(qid)
        if prediction is None or not truths:
            continue
        em += max(exact_match(prediction, t) for t in truths)
        f1 += max(token_f1(prediction, t) for t in truths)
    count = max(len(answers), 1)
    return {"exact_match": 100.0 * em / count, "f1": 100.0 * f1 / count}
