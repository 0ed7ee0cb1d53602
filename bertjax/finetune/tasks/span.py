"""Span classification: a labelled character span of a text (an entity and its type), read by
the span representation [h_start; h_end; pooled span] (bertjax.model.span_heads); accuracy,
macro F1 and MCC over the spans that fit in max_seq_len (the others are counted skips)."""

from __future__ import annotations

import numpy as np

from bertjax.core.errors import UserError
from bertjax.finetune import objectives, schema, scoring, spans
from bertjax.finetune.tasks.base import Outputs, Task, TaskSettings, checked_labels, ids_of
from bertjax.finetune.tasks.sentence import _softmax
from bertjax.model.span_heads import SpanClassifier


class SpanClassification(Task):
    head = "span_classification"
    kind = "span"
    batch = schema.SPAN_CLASSIFICATION
    metrics = ("accuracy", "macro_f1", "mcc")
    objective = objectives.CLASSIFICATION

    @classmethod
    def labels_from(cls, examples, settings: TaskSettings) -> list[str]:
        labels = checked_labels([e.label for e in examples], settings.labels, "the training set")
        if len(labels) < 2:
            raise UserError(f"the training set has only the label(s) {labels}: span "
                            "classification needs at least two")
        return labels

    def model(self, encoder, freeze_encoder):
        return SpanClassifier(encoder, len(self.labels), pooling=self.settings.span_pooling,
                              freeze_encoder=freeze_encoder)

    def encode(self, tokenizer, examples, where, *, training):
        if all(e.label is None for e in examples):
            labels = np.zeros(len(examples), np.int32)  # prediction input
        else:
            labels = ids_of([e.label for e in examples], self.labels, where)
        return spans.encode_spans(tokenizer, examples, self.settings.max_seq_len, labels)

    def evaluate(self, examples, features, outputs: Outputs) -> dict:
        gold = features.arrays["label"]
        predicted = outputs["logits"].argmax(axis=-1)
        return {"accuracy": scoring.accuracy(gold, predicted),
                "macro_f1": scoring.macro_f1(gold, predicted),
                "mcc": scoring.matthews_corrcoef(gold, predicted, len(self.labels))}

    def predict(self, examples, features, outputs: Outputs) -> list[dict]:
        """One record per example; a skipped span (beyond max_seq_len) gets label None."""
        probabilities = _softmax(outputs["logits"].astype(np.float64))
        by_example = dict(zip(features.example.tolist(), probabilities))
        records = []
        for index, e in enumerate(examples):
            record = {"id": e.id, "start": e.start, "end": e.end, "span": e.text[e.start:e.end],
                      "label": None}
            p = by_example.get(index)
            if p is not None:
                record["label"] = self.labels[int(p.argmax())]
                record["probabilities"] = {label: round(float(q), 6)
                                           for label, q in zip(self.labels, p)}
            records.append(record)
        return records

    def heads_info(self) -> dict:
        return {**super().heads_info(), "span_pooling": self.settings.span_pooling}
