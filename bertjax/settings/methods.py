"""The fine-tuning method (`finetune.method` and its keys) from the config's `finetune` section."""

from __future__ import annotations

import dataclasses

from bertjax.finetune.methods import MethodSettings


def read(section) -> MethodSettings:
    """MethodSettings (checked by name as they are made) from the `finetune` section: its
    FinetuneOptions, a Section, or the ConfigDict of configs/finetune_base.py's
    (benchmarks/finetune_method_memory.py)."""
    keys = [field.name for field in dataclasses.fields(MethodSettings) if field.name != "name"]
    return MethodSettings(name=section.method, **{key: getattr(section, key) for key in keys})
