"""Step metrics and how they combine: the naming contract between objectives and the logger.

A step returns a flat dict of scalars. The name of each says its kind:

- SUM: additive over examples (a loss summed over predictions, correct counts, weights, example
  counts), named OBJECTIVE_loss_sum, OBJECTIVE_correct, OBJECTIVE_weight, OBJECTIVE_count. They
  add up exactly over micro-batches, devices, hosts, steps and a logging window; only the
  objective's `summarize` divides, at the end, so an average is never an average of averages.
- LAST: the learning rate, reported as the window's last value (the one a reader expects next to
  the step number).
- MEAN: anything else (the loss, the gradient norm), averaged over the window.

Objectives name their sums with `additive`; the logger reads each name's kind with `kind_of`.
"""

from __future__ import annotations

import enum
from typing import Any


class Kind(enum.Enum):
    SUM = "sum"
    MEAN = "mean"
    LAST = "last"


LOSS_SUM, CORRECT, WEIGHT, COUNT = "loss_sum", "correct", "weight", "count"
_SUM_SUFFIXES = tuple(f"_{part}" for part in (LOSS_SUM, CORRECT, WEIGHT, COUNT))
_LAST_VALUE = ("learning_rate",)


def kind_of(name: str) -> Kind:
    if name.endswith(_SUM_SUFFIXES):
        return Kind.SUM
    return Kind.LAST if name in _LAST_VALUE else Kind.MEAN


def name(objective: str, part: str) -> str:
    """The name of one of an objective's sums, e.g. name("mlm", WEIGHT) == "mlm_weight"."""
    if f"_{part}" not in _SUM_SUFFIXES:
        raise ValueError(f"{part!r} is not a kind of sum ({', '.join(_SUM_SUFFIXES)})")
    return f"{objective}_{part}"


def additive(objective: str, *, loss_sum: Any, correct: Any = None, weight: Any = None,
             count: Any = None) -> dict[str, Any]:
    """An objective's sums under their contract names; parts left None are not emitted."""
    parts = {LOSS_SUM: loss_sum, CORRECT: correct, WEIGHT: weight, COUNT: count}
    return {name(objective, part): value for part, value in parts.items() if value is not None}
