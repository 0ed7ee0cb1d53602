"""The fine-tuning tasks, by `config.task` name."""

from __future__ import annotations

from bertjax.errors import check_choice
from bertjax.finetune.tasks.base import Task, TaskSettings
from bertjax.finetune.tasks.qa import QuestionAnswering
from bertjax.finetune.tasks.sentence import Classification, Regression
from bertjax.finetune.tasks.span import SpanClassification
from bertjax.finetune.tasks.tagging import TokenClassification

TASKS: dict[str, type[Task]] = {
    "finetune_classification": Classification,
    "finetune_regression": Regression,
    "finetune_token_classification": TokenClassification,
    "finetune_qa": QuestionAnswering,
    "finetune_span_classification": SpanClassification,
}


def task_class(name: str) -> type[Task]:
    return TASKS[check_choice("fine-tuning task", name, TASKS, unknown=True)]


__all__ = ["TASKS", "Task", "TaskSettings", "task_class"]
