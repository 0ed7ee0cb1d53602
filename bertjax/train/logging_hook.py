"""The logging hook: window averages of step metrics, read from the device one step late.

At a log step N the window's device values are only set aside; they are fetched when step N+1 has
been dispatched, so the host never waits for the accelerator to drain. Step time, throughput and
MFU are timed between two such fetches (bertjax/train/step_timing.py).
"""

from __future__ import annotations

import contextlib
from typing import Any, Callable, Iterator, Mapping

import jax
import numpy as np

from bertjax.train.metrics_log import MetricsWriter, check_finite
from bertjax.train.step_metrics import Kind, kind_of
from bertjax.train.step_timing import StepTimer


class LoggingHook:
    def __init__(self, writer: MetricsWriter, every: int, *,
                 summarize: Callable[[Mapping[str, float]], dict],
                 step_info: Callable[[int], dict], timer: StepTimer, progress=None):
        self._writer = writer
        self._every = every
        self._summarize = summarize
        self._step_info = step_info
        self._timer = timer
        self._progress = progress
        self._window: list[Any] = []
        self._ready: tuple | None = None
        self.last_logged: dict = {}

    def __call__(self, step: int, state: Any, metrics: Any, *, final: bool) -> None:
        self._window.append(metrics)
        self.flush()  # before the timer counts this step: the window fetched ends before it
        self._timer.step(step, metrics)
        if (self._every > 0 and step % self._every == 0) or final:
            self._ready = (step, self._window)
            self._window = []
        if final:
            self.flush()

    @contextlib.contextmanager
    def untimed(self) -> Iterator[None]:
        """Host work between steps (evaluation, a checkpoint), left out of the step time; what
        was set aside is written first."""
        self.flush()
        with self._timer.paused():
            yield

    def flush(self) -> None:
        """Writes what was set aside now (before a checkpoint: the log must reach its step)."""
        if self._ready is not None:
            self._flush(*self._ready)
            self._ready = None

    def _flush(self, step: int, window: list) -> None:
        host = jax.device_get(window)  # waits for the window's last step to finish
        timing = self._timer.fields()
        record = window_summary(host, self._summarize)
        record.update(self._step_info(step))
        record.update(timing)
        check_finite(step, record, window_start=step - len(window) + 1)
        self._writer.write(step, record)
        self.last_logged = {"step": step, **record}
        if self._progress is not None:
            shown = {k: record[k] for k in ("loss", "mlm_accuracy", "accuracy") if k in record}
            if "tokens_per_sec" in record:
                shown["tok_s"] = f"{record['tokens_per_sec']:,.0f}"
            self._progress.describe(step, **shown)


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
