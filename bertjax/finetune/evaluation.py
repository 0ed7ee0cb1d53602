"""Evaluation of a fine-tuning run: every dev output through the predict step, metrics on the host,
and which evaluation is the best so far.

The dev batches are placed on the devices once and reused at every epoch end; each process feeds
its own rows, and the outputs come back whole (replicated) to every process. With length buckets
the rows are sorted by length, each batch is cut to its bucket (one compiled shape per bucket),
and the outputs are put back in row order and padded back to max_seq_len along their token axes.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Sequence

import jax
import numpy as np
from jax.sharding import Mesh

from bertjax.finetune import features as feats
from bertjax.core import length_buckets
from bertjax.finetune import length_bucketing
from bertjax.finetune.schema import abstract_batch
from bertjax.finetune.tasks import Task
from bertjax.parallel import partitioning

LOWER_IS_BETTER = ("mse",)


class Evaluator:
    def __init__(self, task: Task, predict_step: Callable, mesh: Mesh, features: feats.Features,
                 examples: Sequence, batch_size: int, local_rows: slice,
                 buckets: tuple[int, ...] = ()):
        self.task = task
        self.features = features
        self.examples = examples
        self._predict_step = predict_step
        self._mesh = mesh
        self._batch_size = batch_size
        self._local_rows = local_rows
        self._placed: list[dict] | None = None
        self._lengths = (length_bucketing.row_lengths(features.arrays) if len(buckets) > 1
                         else None)
        self._buckets = buckets
        n = len(features)
        self._order = (np.arange(n) if self._lengths is None
                       else np.argsort(self._lengths, kind="stable"))

    def _batches(self) -> list[dict]:
        if self._placed is None:
            ordered = {k: v[self._order] for k, v in self.features.arrays.items()}
            self._placed = []
            for batch in feats.batches(ordered, self._batch_size):
                if self._lengths is not None:
                    real = length_bucketing.row_lengths(batch)[batch["weight"] > 0]
                    batch = length_bucketing.cut(
                        batch, length_buckets.fitting(int(real.max()), self._buckets))
                self._placed.append(partitioning.global_batch(
                    {k: v[self._local_rows] for k, v in batch.items()}, self._mesh))
        return self._placed

    def outputs(self, params: Any) -> dict[str, np.ndarray]:
        """The outputs `task.output_keys()` for every feature row, in order, on the host."""
        keys = self.task.output_keys()
        full = self._full_shapes(params, keys)
        collected = {key: [] for key in keys}
        for batch in self._batches():
            out = self._predict_step(params, batch)
            # Fetched batch by batch: dozens of queued executions whose outputs are gathered
            # across devices can starve the CPU backend's in-process collectives (a deadlock
            # seen with 8 host devices on 2 cores); evaluation is a small part of a run.
            for key, value in jax.device_get({key: out[key] for key in keys}).items():
                collected[key].append(_padded_to(value, full[key]))
        inverse = np.argsort(self._order)
        return {key: np.concatenate(values)[:len(self.features)][inverse]
                for key, values in collected.items()}

    def _full_shapes(self, params: Any, keys: Sequence[str]) -> dict[str, tuple | None]:
        """Each output's shape for an uncut batch (None without buckets: nothing to pad)."""
        if self._lengths is None:
            return {key: None for key in keys}
        batch = abstract_batch(self.features.arrays, self._batch_size)
        shapes = jax.eval_shape(self._predict_step, params, batch)
        return {key: tuple(shapes[key].shape[1:]) for key in keys}

    def metrics(self, params: Any) -> dict:
        return self.task.evaluate(self.examples, self.features, self.outputs(params))


def _padded_to(value: np.ndarray, full: tuple | None) -> np.ndarray:
    """A batch's output padded with zeros along its token axes to the uncut shape (the padded
    positions are beyond every row's tokens, where nothing reads)."""
    if full is None or tuple(value.shape[1:]) == full:
        return value
    return np.pad(value, [(0, 0)] + [(0, f - v) for v, f in zip(value.shape[1:], full)])


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
