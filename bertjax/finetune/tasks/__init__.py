"""The fine-tuning tasks, by `config.task` name."""

from __future__ import annotations

from typing import Sequence

from bertjax.data.tokenizer import Tokenizer
from bertjax.core.errors import check_choice
from bertjax.finetune.tasks.base import Task, TaskSettings
from bertjax.finetune.tasks.cloze import ClozeClassification
from bertjax.finetune.tasks.qa import QuestionAnswering
from bertjax.finetune.tasks.retrieval import Retrieval
from bertjax.finetune.tasks.sentence import Classification, Regression
from bertjax.finetune.tasks.span import SpanClassification
from bertjax.finetune.tasks.tagging import TokenClassification

TASKS: dict[str, type[Task]] = {
    "finetune_classification": Classification,
    "finetune_regression": Regression,
    "finetune_token_classification": TokenClassification,
    "finetune_qa": QuestionAnswering,
    "finetune_span_classification": SpanClassification,
    "finetune_retrieval": Retrieval,
}


def task_class(name: str) -> type[Task]:
    return TASKS[check_choice("fine-tuning task", name, TASKS, unknown=True)]


def make_task(name: str, settings: TaskSettings, labels: Sequence[str],
              tokenizer: Tokenizer) -> Task:
    """The task `name` with its labels; a classification whose settings carry a verbalizer is
    the cloze form (its verbalizer words are looked up in `tokenizer`)."""
    cls = task_class(name)
    if settings.verbalizer and cls is Classification:
        return ClozeClassification(settings, labels, tokenizer)
    return cls(settings, labels)


__all__ = ["TASKS", "Task", "TaskSettings", "make_task", "task_class"]
