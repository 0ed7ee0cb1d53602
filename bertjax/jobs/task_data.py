"""The data side of a fine-tuning run: examples and features, read once and shared by every
restart. Every input problem is refused here, before anything is written."""

from __future__ import annotations

import dataclasses

import numpy as np

from bertjax.data.tokenizer import Tokenizer
from bertjax.core.errors import UserError
from bertjax.finetune import readers
from bertjax.finetune.tasks import Task, TaskSettings, make_task, task_class
from bertjax.settings.finetune import FinetuneSettings


@dataclasses.dataclass
class TaskData:
    """Everything a training run needs from the data, independent of its seed."""

    task: Task
    train_examples: list
    eval_examples: list
    train_features: object
    eval_features: object
    counted: dict  # per split: skipped or truncated examples, by reason


def _limited(examples: list, limit: int) -> list:
    """A fixed sample of `limit` examples in file order (files are often sorted by label, so
    the first `limit` would not do)."""
    if not limit or limit >= len(examples):
        return examples
    chosen = np.sort(np.random.default_rng(0).permutation(len(examples))[:limit])
    return [examples[i] for i in chosen]


def _per_class(examples: list, k: int) -> list:
    """A fixed sample of `k` examples of each label (fewer where a label has fewer), in file
    order: the few-shot training sets of PET (16, 32, 64 ... per class)."""
    if not k:
        return examples
    rng = np.random.default_rng(0)
    by_label: dict = {}
    for i, example in enumerate(examples):
        by_label.setdefault(example.label, []).append(i)
    chosen = [i for label in sorted(by_label, key=str) for i in
              rng.permutation(by_label[label])[:k]]
    return [examples[i] for i in sorted(chosen)]


def declared_labels(s: FinetuneSettings, cls: type[Task]) -> TaskSettings:
    """The task settings, with the label order the training source declares (a TFDS ClassLabel's
    names, in index order, not sorted) when data.labels is empty."""
    if s.task_settings.labels or cls.kind != "text" or cls.regression:
        return s.task_settings
    declared = readers.label_order(s.data.source(s.data.train, labeled=True, regression=False))
    return dataclasses.replace(s.task_settings, labels=declared) if declared else s.task_settings


def read_task_data(s: FinetuneSettings, tokenizer: Tokenizer) -> TaskData:
    """Reads and featurizes the training and dev data."""
    cls = task_class(s.task)

    def read(path: str) -> list:
        source = s.data.source(path, labeled=True, regression=cls.regression)
        return readers.read(source, cls.kind)

    train_examples = _limited(_per_class(read(s.data.train), s.data.max_train_examples_per_class),
                              s.data.max_train_examples)
    eval_examples = _limited(read(s.data.eval), s.data.max_eval_examples)
    task_settings = declared_labels(s, cls)
    task = make_task(s.task, task_settings, cls.labels_from(train_examples, task_settings),
                     tokenizer)
    train_features = task.featurize(tokenizer, train_examples, s.data.train, training=True)
    eval_features = task.featurize(tokenizer, eval_examples, s.data.eval, training=False)
    if not len(train_features):
        raise UserError(f"no training example of {s.data.train} could be used: "
                        f"{dict(train_features.counts) or 'none left'}")
    # Reported when the run starts (FinetuneRun), not here: a refusal still to come (another
    # run in the workdir, a bad mesh) must be the one line a refused command prints.
    counted = {"train": dict(train_features.counts), "eval": dict(eval_features.counts)}
    return TaskData(task, train_examples, eval_examples, train_features, eval_features, counted)
