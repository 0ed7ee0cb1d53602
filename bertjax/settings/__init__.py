"""Config in, typed settings out: the only package that reads an ml_collections ConfigDict.

`read(config)` turns a job's config into frozen dataclasses (`PretrainSettings` or
`FinetuneSettings`, which share `ModelSpec` and `MeshSettings`), refusing a bad value by its key
name before any file is read or written. Everything below the job drivers takes these settings (or
the plain dataclasses inside them), never the ConfigDict.
"""

from __future__ import annotations

import ml_collections

from bertjax.core.errors import UserError
from bertjax.settings import finetune, pretrain
from bertjax.settings.config_keys import strict
from bertjax.settings.finetune import FinetuneSettings
from bertjax.settings.pretrain import PretrainSettings

Settings = PretrainSettings | FinetuneSettings


def read(config: ml_collections.ConfigDict, overridden: frozenset = frozenset()) -> Settings:
    """`overridden`: the config keys given on the command line (some checks tell a value the
    user chose from a default). A key the config lacks is refused by name: the config files
    declare every key, with its default."""
    config = strict(config)
    task = config.task
    if task == "pretrain":
        return pretrain.read(config, overridden)
    if task.startswith("finetune"):
        return finetune.read(config)
    raise UserError(f"unknown task {task!r}: expected pretrain or finetune_*")


def task_of(config: ml_collections.ConfigDict) -> str:
    """The task a config names, for a command that takes only some tasks to refuse the others
    by name before their settings are read."""
    return strict(config).task


__all__ = ["FinetuneSettings", "PretrainSettings", "Settings", "read", "task_of"]
