"""Evaluation of a fine-tuning run: every dev output through the predict step, metrics on the host,
and which evaluation is the best so far.

The dev batches are placed on the devices once and reused at every epoch end; each process feeds
its own rows, and the outputs come back whole (replicated) to every process.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from bertjax.finetune import features as feats
from bertjax.finetune.tasks import Task
from bertjax.parallel import partitioning

LOWER_IS_BETTER = ("mse",)


class Evaluator:
    def __init__(self, task: Task, predict_step: Callable, mesh: Mesh, features: feats.Features,
                 examples: Sequence, batch_size: int, local_rows: slice):
        self.task = task
        self.features = features
        self.examples = examples
        self._predict_step = predict_step
        self._mesh = mesh
        self._batch_size = batch_size
        self._local_rows = local_rows
        self._placed: list[dict] | None = None

    def _batches(self) -> list[dict]:
        if self._placed is None:
            self._placed = [
                partitioning.global_batch({k: v[self._local_rows] for k, v in batch.items()},
                                          self._mesh)
                for batch in feats.batches(self.features.arrays, self._batch_size)]
        return self._placed

    def outputs(self, params: Any) -> dict[str, np.ndarray]:
        """The outputs `task.output_keys()` for every feature row, in order, on the host."""
        keys = self.task.output_keys()
        collected = {key: [] for key in keys}
        for batch in self._batches():
            out = self._predict_step(params, batch)
            # Fetched batch by batch: dozens of queued executions whose outputs are gathered
            # across devices can starve the CPU backend's in-process collectives (a deadlock
            # seen with 8 host devices on 2 cores); evaluation is a small part of a run.
            for key, value in jax.device_get({key: out[key] for key in keys}).items():
                collected[key].append(value)
        return {key: np.concatenate(values)[:len(self.features)]
                for key, values in collected.items()}

    def metrics(self, params: Any) -> dict:
        return self.task.evaluate(self.examples, self.features, self.outputs(params))


def is_better(metric: str, new: float, old: float | None) -> bool:
    """Whether `new` beats `old` (None: nothing yet); a NaN never wins."""
    if new is None or (isinstance(new, float) and math.isnan(new)):
        return False
    if old is None:
        return True
    return new < old if metric in LOWER_IS_BETTER else new > old


def shown(metric: float | None) -> str:
    """A metric for a log line; None (no evaluation gave a number) is n/a."""
    return "n/a" if metric is None else f"{metric:.4f}"


def scalars(metrics: dict, prefix: str = "") -> dict[str, float]:
    """The numeric entries (metrics.jsonl takes scalars; per-type tables go to results.json)."""
    return {prefix + k: float(v) for k, v in metrics.items()
            if isinstance(v, (int, float, np.floating, np.integer))}
