"""Sentence and sentence-pair tasks: classification (accuracy, MCC, F1) and regression (Pearson,
Spearman). A pair task is a classification whose source names a second text column."""

from __future__ import annotations

from typing import Sequence

import numpy as np

from bertjax.core.errors import UserError
from bertjax.finetune import features as feats
from bertjax.finetune import objectives, schema, scoring
from bertjax.finetune.examples import TextExample
from bertjax.finetune.tasks.base import Outputs, Task, TaskSettings, checked_labels, ids_of
from bertjax.model.task_heads import SequenceClassifier


def _softmax(logits: np.ndarray) -> np.ndarray:
    shifted = logits - logits.max(axis=-1, keepdims=True)
    e = np.exp(shifted)
    return e / e.sum(axis=-1, keepdims=True)


def check_pairs(examples: Sequence[TextExample], where: str) -> None:
    paired = {e.text_pair is not None for e in examples}
    if len(paired) > 1:
        raise UserError(f"{where}: some examples have a second text and some do not")


class Classification(Task):
    head = "sequence_classification"
    kind = "text"
    batch = schema.CLASSIFICATION
    packed_batch = schema.PACKED_CLASSIFICATION
    metrics = ("accuracy", "mcc", "f1")
    objective = objectives.CLASSIFICATION

    @classmethod
    def labels_from(cls, examples, settings: TaskSettings) -> list[str]:
        labels = checked_labels([e.label for e in examples], settings.labels, "the training set")
        if len(labels) < 2:
            raise UserError(f"the training set has only the label(s) {labels}: classification "
                            "needs at least two")
        if settings.positive_label and settings.positive_label not in labels:
            raise UserError(f"data.positive_label {settings.positive_label!r} is not a label "
                            f"({', '.join(labels)})")
        return labels

    def model(self, encoder, freeze_encoder):
        return SequenceClassifier(encoder, len(self.labels), freeze_encoder=freeze_encoder,
                                  prompt_length=self.settings.prompt_length)

    def encode(self, tokenizer, examples, where, *, training):
        check_pairs(examples, where)
        return feats.encode_sentences(tokenizer, examples, self.settings.max_seq_len,
                                      self.label_ids(examples, where),
                                      self.settings.prompt_length)

    def label_ids(self, examples, where: str) -> np.ndarray:
        if all(e.label is None for e in examples):
            return np.zeros(len(examples), np.int32)  # prediction input
        return ids_of([e.label for e in examples], self.labels, where)

    def evaluate(self, examples, features, outputs: Outputs) -> dict:
        gold = features.arrays["label"]
        predicted = outputs["logits"].argmax(axis=-1)
        n = len(self.labels)
        # Binary F1 is that of data.positive_label, by default the second label ("1" in GLUE's
        # MRPC/QQP TSVs, "equivalent" in TFDS's glue/mrpc); macro F1 otherwise.
        positive = (self.labels.index(self.settings.positive_label)
                    if self.settings.positive_label else 1)
        f1 = (scoring.f1_of_class(gold, predicted, positive) if n == 2
              else scoring.macro_f1(gold, predicted))
        return {"accuracy": scoring.accuracy(gold, predicted),
                "mcc": scoring.matthews_corrcoef(gold, predicted, n), "f1": f1}

    def predict(self, examples, features, outputs: Outputs) -> list[dict]:
        probabilities = _softmax(outputs["logits"].astype(np.float64))
        return [{"id": e.id, "label": self.labels[int(p.argmax())],
                 "probabilities": {label: round(float(q), 6) for label, q in zip(self.labels, p)}}
                for e, p in zip(examples, probabilities)]


class Regression(Task):
    head = "regression"
    kind = "text"
    batch = schema.REGRESSION
    packed_batch = schema.PACKED_REGRESSION
    metrics = ("pearson", "spearman", "mse")
    objective = objectives.REGRESSION
    regression = True

    @classmethod
    def labels_from(cls, examples, settings: TaskSettings) -> list[str]:
        return ["score"]

    def model(self, encoder, freeze_encoder):
        return SequenceClassifier(encoder, 1, freeze_encoder=freeze_encoder,
                                  prompt_length=self.settings.prompt_length)

    def encode(self, tokenizer, examples, where, *, training):
        check_pairs(examples, where)
        scores = np.asarray([0.0 if e.label is None else e.label for e in examples], np.float32)
        return feats.encode_sentences(tokenizer, examples, self.settings.max_seq_len, scores,
                                      self.settings.prompt_length)

    def evaluate(self, examples, features, outputs: Outputs) -> dict:
        gold = features.arrays["label"].astype(np.float64)
        predicted = outputs["logits"][:, 0].astype(np.float64)
        return {"pearson": scoring.pearson(gold, predicted),
                "spearman": scoring.spearman(gold, predicted),
                "mse": float(np.mean((gold - predicted) ** 2))}

    def predict(self, examples, features, outputs: Outputs) -> list[dict]:
        return [{"id": e.id, "score": float(s)} for e, s in zip(examples, outputs["logits"][:, 0])]
