"""What every fine-tuning task supplies to the trainer.

A task knows its labels (fixed from the training data, or given), its head, its objective, how to
turn examples into features, and how to turn the model's outputs for a feature set back into
metrics and predictions (on the host: F1, correlations and span search need every output).
"""

from __future__ import annotations

import abc
import collections
import dataclasses
from typing import Any, Sequence

import flax.linen as nn
import numpy as np

from bertjax.data.tokenizer import Tokenizer
from bertjax.core.errors import UserError, check_choice
from bertjax.data.schema import Field
from bertjax.finetune import schema
from bertjax.finetune.features import Features
from bertjax.model.config import EncoderConfig
from bertjax.model.span_heads import check_pooling
from bertjax.train.objectives import StepObjective

Outputs = dict[str, np.ndarray]  # the model's outputs for every feature row, on the host
RETRIEVAL_POOLINGS = ("mean", "cls")


@dataclasses.dataclass(frozen=True)
class TaskSettings:
    max_seq_len: int = 128
    # The label order (ids); empty: the training set's labels sorted (a TFDS source's own order).
    labels: tuple[str, ...] = ()
    positive_label: str = ""  # binary classification F1; empty: the second label of the order
    main_metric: str = ""  # what picks the best checkpoint; empty: the task's default
    all_subwords: bool = True  # token classification: tag every subword (else the first only)
    crf: bool = False  # token classification: a linear-chain CRF on the emissions
    doc_stride: int = 128  # QA
    max_query_length: int = 64  # QA
    max_answer_length: int = 30  # QA, in tokens
    # bertjax.finetune.methods: soft-prompt vectors after [CLS] (0: none); a verbalizer
    # ("label:word,...") makes classification a cloze task scored at the template's [MASK].
    prompt_length: int = 0
    template: str = ""
    verbalizer: str = ""
    span_pooling: str = "mean"  # span classification and the QA span scorer: mean | attention
    qa_scorer: str = "start_end"  # QA: start_end (start + end logits) | span (an MLP per span)
    pooling: str = "mean"  # retrieval: cls | mean, of the last layer
    separate_encoders: bool = False  # retrieval: a document encoder of its own
    temperature: float = 0.05  # retrieval: cosine scores are divided by it

    def __post_init__(self):
        if self.max_seq_len < 8:
            raise UserError(f"data.max_seq_len must be at least 8, got {self.max_seq_len}")
        check_choice("finetune.pooling", self.pooling, RETRIEVAL_POOLINGS)
        if not self.temperature > 0:  # NaN too
            raise UserError(f"finetune.temperature must be positive, got {self.temperature}")
        for name in ("doc_stride", "max_query_length", "max_answer_length"):
            if getattr(self, name) < 1:
                raise UserError(f"data.{name} must be positive, got {getattr(self, name)}")
        refuse_duplicate_labels(self.labels)
        check_pooling(self.span_pooling)
        check_choice("finetune.qa_scorer", self.qa_scorer, QA_SCORERS)


def refuse_duplicate_labels(labels: Sequence[str]) -> None:
    """A label listed twice would get two ids, and the head a class no example can have."""
    twice = [label for label, n in collections.Counter(labels).items() if n > 1]
    if twice:
        counts = collections.Counter(labels)
        listed = ", ".join(f"{label} {_times(counts[label])}" for label in twice)
        raise UserError(f"data.labels lists {listed}; list each label once")


def _times(n: int) -> str:
    return "twice" if n == 2 else f"{n} times"


def parse_labels(text: str) -> tuple[str, ...]:
    """data.labels ("neg,pos") as a tuple; a label listed twice is refused by name."""
    labels = tuple(part.strip() for part in text.split(",") if part.strip())
    refuse_duplicate_labels(labels)
    return labels


# What a trained model's features and decoding depend on: stored in run.json ("task_settings")
# and what predict mode uses, whatever the config says.
RECORDED_SETTINGS = ("max_seq_len", "all_subwords", "doc_stride", "max_query_length",
                     "max_answer_length", "prompt_length", "template", "verbalizer",
                     "span_pooling", "qa_scorer", "pooling", "separate_encoders", "temperature")
QA_SCORERS = ("start_end", "span")


class Task(abc.ABC):
    head: str  # run.json heads.head, read by export
    kind: str  # the examples it reads: "text", "retrieval", "tagged" or "qa"
    metrics: tuple[str, ...]  # what `evaluate` reports; the first is the default main metric
    batch: dict[str, Field]  # its features' arrays, declared in `bertjax.finetune.schema`
    optional_batch: dict[str, Field] = {}  # arrays some of its feature sets add
    # Its packed training rows (train.packing); None: the task is not trained packed.
    packed_batch: dict[str, Field] | None = None
    regression = False

    def __init__(self, settings: TaskSettings, labels: Sequence[str]):
        self.settings = settings
        self.labels = list(labels)
        self.main_metric = settings.main_metric or self.metrics[0]
        if self.main_metric not in self.metrics:
            raise UserError(f"train.main_metric {self.main_metric!r} is not a metric of this "
                            f"task ({', '.join(self.metrics)})")

    @classmethod
    @abc.abstractmethod
    def labels_from(cls, examples: Sequence, settings: TaskSettings) -> list[str]:
        """The label list, from the training examples (or checked against settings.labels)."""

    @property
    @abc.abstractmethod
    def objective(self) -> StepObjective: ...

    @abc.abstractmethod
    def model(self, encoder: EncoderConfig, freeze_encoder: bool) -> nn.Module:
        """The model; a soft prompt (settings.prompt_length) implies a frozen encoder."""

    def featurize(self, tokenizer: Tokenizer, examples: Sequence, where: str, *,
                  training: bool) -> Features:
        """Features, their arrays conformed to the task's batch; a label unseen in training is
        a UserError naming `where`."""
        features = self.encode(tokenizer, examples, where, training=training)
        features.arrays = schema.conform(features.arrays, self.batch, self.optional_batch)
        return features

    @abc.abstractmethod
    def encode(self, tokenizer: Tokenizer, examples: Sequence, where: str, *,
               training: bool) -> Features:
        """The features of `examples`, as the task builds them (`featurize` checks them)."""

    @abc.abstractmethod
    def evaluate(self, examples: Sequence, features: Features, outputs: Outputs) -> dict:
        """Metrics (names in `metrics`) of the outputs against the examples' labels."""

    @abc.abstractmethod
    def predict(self, examples: Sequence, features: Features, outputs: Outputs) -> Any:
        """Predictions: a list of JSON records (one per example), or a JSON object (QA)."""

    def heads_info(self) -> dict:
        length = self.settings.prompt_length
        prompt = {"prompt_length": length} if length else {}
        return {"head": self.head, "num_labels": len(self.labels), "labels": self.labels,
                "crf": False, **prompt}

    def recorded_settings(self) -> dict:
        """run.json's "task_settings" (beside "heads", which export reads and must not change)."""
        return {name: getattr(self.settings, name) for name in RECORDED_SETTINGS}

    def output_keys(self) -> tuple[str, ...]:
        """The model outputs evaluation needs (others stay on the device)."""
        return ("logits",)

    def encoder_subtrees(self) -> tuple[str, ...]:
        """The parameter subtrees that start from init_checkpoint's encoder."""
        return ("encoder",)


def ids_of(values: Sequence[str], labels: Sequence[str], where: str) -> np.ndarray:
    """Label ids; labels the training set did not have are refused by name."""
    index = {label: i for i, label in enumerate(labels)}
    unseen = sorted({v for v in values if v not in index})
    if unseen:
        shown = ", ".join(repr(u) for u in unseen[:5]) + (" ..." if len(unseen) > 5 else "")
        raise UserError(f"{where}: label(s) {shown} not seen in training (labels: "
                        f"{', '.join(labels)}); set data.labels to list every label")
    return np.asarray([index[v] for v in values], np.int32)


def checked_labels(found: Sequence[str], given: Sequence[str], where: str) -> list[str]:
    """`given` (if set, every found label must be in it), else the sorted found labels."""
    if given:
        missing = sorted(set(found) - set(given))
        if missing:
            raise UserError(f"{where}: label(s) {', '.join(map(repr, missing[:5]))} are not in "
                            f"data.labels ({', '.join(given)})")
        return list(given)
    return sorted(set(found))
