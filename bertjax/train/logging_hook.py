"""The logging hook: window averages of step metrics, read from the device one step late.

At a log step N the window's device values are only set aside; they are fetched when step N+1 has
been dispatched, so the host never waits for the accelerator to drain. Throughput is timed between
two such fetches: dispatch is asynchronous, so only a fetched value proves that a step has finished.
"""

from __future__ import annotations

import time
from typing import Any, Callable, Mapping

import jax
import numpy as np

from bertjax.train.metrics_log import MetricsWriter, check_finite
from bertjax.train.step_metrics import Kind, kind_of


class LoggingHook:
    def __init__(self, writer: MetricsWriter, every: int, *,
                 summarize: Callable[[Mapping[str, float]], dict],
                 step_info: Callable[[int], dict], tokens_in_step: Callable[[int], int],
                 progress=None):
        self._writer = writer
        self._every = every
        self._summarize = summarize
        self._step_info = step_info
        self._tokens_in_step = tokens_in_step
        self._progress = progress
        self._window: list[Any] = []
        self._window_tokens = 0
        self._ready: tuple | None = None
        self._finished_at = time.perf_counter()
        self.last_logged: dict = {}

    def __call__(self, step: int, state: Any, metrics: Any, *, final: bool) -> None:
        self._window.append(metrics)
        self._window_tokens += self._tokens_in_step(step)
        self.flush()
        if (self._every > 0 and step % self._every == 0) or final:
            self._ready = (step, self._window, self._window_tokens)
            self._window, self._window_tokens = [], 0
        if final:
            self.flush()

    def flush(self) -> None:
        """Writes what was set aside now (before a checkpoint: the log must reach its step)."""
        if self._ready is not None:
            self._flush(*self._ready)
            self._ready = None

    def _flush(self, step: int, window: list, tokens: int) -> None:
        host = jax.device_get(window)  # waits for the window's last step to finish
        now = time.perf_counter()
        seconds, self._finished_at = max(now - self._finished_at, 1e-9), now
        record = window_summary(host, self._summarize)
        record.update(self._step_info(step))
        record["tokens_per_sec"] = tokens / seconds
        record["steps_per_sec"] = len(window) / seconds
        check_finite(step, record, window_start=step - len(window) + 1)
        self._writer.write(step, record)
        self.last_logged = {"step": step, **record}
        if self._progress is not None:
            shown = {k: record[k] for k in ("loss", "mlm_accuracy", "accuracy") if k in record}
            self._progress.describe(step, **shown, tok_s=f"{record['tokens_per_sec']:,.0f}")


def window_summary(step_metrics: list[Mapping[str, Any]], summarize) -> dict:
    """Combines the window's step metrics by their kind (bertjax.train.step_metrics), then
    summarizes the sums."""
    sums: dict[str, float] = {}
    values: dict[str, list[float]] = {}
    for metrics in step_metrics:
        for key, value in metrics.items():
            value = float(np.asarray(value))
            if kind_of(key) is Kind.SUM:
                sums[key] = sums.get(key, 0.0) + value
            else:
                values.setdefault(key, []).append(value)
    record = {key: series[-1] if kind_of(key) is Kind.LAST else float(np.mean(series))
              for key, series in values.items()}
    record.update(summarize(sums))
    return record
