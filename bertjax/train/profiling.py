"""A `jax.profiler` trace of chosen steps (train.profile_steps=START,END), for TensorBoard's
profile plugin or XProf.

The trace covers the steps that take the step count from START to END (steps START+1 to END),
on process 0's devices and host. It starts once step START has been dispatched (before the
first step when START is where the run starts) and ends once step END has finished, or when the
run ends first (its time budget, a preemption, an error), so the file written is complete.
jax.profiler writes DIR/plugins/profile/<time>/<host>.xplane.pb.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Any, Callable, ContextManager

import jax

PROFILE_DIR = "profile"


class StepProfiler:
    """A loop hook and a context manager around the loop. `untimed()` wraps starting and
    stopping the trace (host work left out of the step time); `written()` runs once the trace
    is on disk (a workdir on a bucket pushes it)."""

    def __init__(self, workdir: str, steps: tuple[int, int] | None, start_step: int, *,
                 untimed: Callable[[], ContextManager] = contextlib.nullcontext,
                 written: Callable[[], None] = lambda: None):
        self.directory = os.path.join(workdir, PROFILE_DIR)
        self._first, self._last = steps or (0, 0)
        self._enabled = steps is not None and jax.process_index() == 0 and \
            start_step < self._last
        self._start_step = start_step
        self._untimed, self._written = untimed, written
        self._tracing = False

    def __enter__(self) -> "StepProfiler":
        if self._enabled and self._start_step >= self._first:  # a resume inside the range
            self._start()
        return self

    def __call__(self, step: int, state: Any, metrics: Any, *, final: bool) -> None:
        if not self._enabled:
            return
        if step == self._first and not self._tracing:
            self._start()
        elif self._tracing:
            self._traced = (self._traced[0] or step, step)
            if step >= self._last or final:
                self._stop(metrics)

    def __exit__(self, kind, error, trace) -> None:
        if self._tracing:  # the run ended before step END: the trace of what ran
            self._stop(None, failed=kind is not None)

    def _start(self) -> None:
        with self._untimed():
            jax.profiler.start_trace(self.directory)
        self._tracing, self._traced = True, (0, 0)

    def _stop(self, metrics, *, failed: bool = False) -> None:
        """After an error (`failed`) the trace is only closed: the logger and the upload are
        left alone (the workdir's closing uploads it), the error is the one to report."""
        with contextlib.nullcontext() if failed else self._untimed():
            if metrics is not None:
                jax.block_until_ready(metrics)  # the last step's device work, in the trace
            jax.profiler.stop_trace()
            self._tracing = self._enabled = False
            first, last = self._traced
            steps = f"steps {first}-{last}" if first else "no step"
            print(f"profiler trace of {steps}: {self.directory} (tensorboard --logdir "
                  f"{self.directory})", file=sys.stderr)
            if not failed:
                self._written()
