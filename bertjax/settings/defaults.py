"""A config section built from the dataclass it is read into: the one place of each key's default.

Every key of a schema section (the model, optimizer, masking, mesh, ELECTRA, corpus, schedule and
pretraining loop sections) has its default, its meaning and its check in its dataclass;
configs/base.py and configs/finetune_base.py build those sections with `section(...)`, and every
config file states only what its recipe changes. Reading stays strict (config_keys.py): a key the
config lacks is refused by name, never filled in from these defaults.
"""

from __future__ import annotations

import dataclasses

import ml_collections


def defaults(schema, skip=()) -> dict:
    """`schema`'s fields but `skip` (those a job fills in itself), each with its default."""
    values = {}
    for field in dataclasses.fields(schema):
        if field.name in skip:
            continue
        if field.default is dataclasses.MISSING:
            raise TypeError(f"{schema.__name__}.{field.name} has no default: a config section "
                            "is built only from fields that have one")
        values[field.name] = field.default
    return values


def section(schema, *, skip=(), **changes) -> ml_collections.ConfigDict:
    """A config section: `schema`'s defaults (but `skip`), with `changes` (a recipe's values)."""
    values = defaults(schema, skip)
    unknown = sorted(set(changes) - set(values))
    if unknown:  # a KeyError: config_flags turns a ValueError into a traceback dump
        raise KeyError(f"{schema.__name__} has no setting {', '.join(unknown)}")
    return ml_collections.ConfigDict({**values, **changes})
