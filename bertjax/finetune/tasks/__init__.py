"""The fine-tuning tasks, by `config.task` name."""

from __future__ import annotations

from bertjax.errors import UserError
from bertjax.finetune.tasks.base import Task, TaskSettings
from bertjax.finetune.tasks.qa import QuestionAnswering
from bertjax.finetune.tasks.sentence import Classification, Regression
from bertjax.finetune.tasks.tagging import TokenClassification

TASKS: dict[str, type[Task]] = {
    "finetune_classification": Classification,
    "finetune_regression": Regression,
    "finetune_token_classification": TokenClassification,
    "finetune_qa": QuestionAnswering,
}


def task_class(name: str) -> type[Task]:
    if name not in TASKS:
        raise UserError(f"unknown fine-tuning task {name!r}; choose one of {', '.join(TASKS)}")
    return TASKS[name]


__all__ = ["TASKS", "Task", "TaskSettings", "task_class"]
