"""The training loop: feed batches to a compiled step, and run `every=n` hooks. No model math here.

Hooks see the step number after the update, the new state and the step's metrics (device values).
They decide what to do from the step alone, which keeps a resumed run's hooks firing at exactly the
steps an uninterrupted run's would.
"""

from __future__ import annotations

import dataclasses
import signal
import sys
import threading
import time
from typing import Any, Callable, Iterator, Protocol, Sequence

from tqdm import tqdm

from bertjax.parallel import distributed


class Hook(Protocol):
    def __call__(self, step: int, state: Any, metrics: Any, *, final: bool) -> None: ...


@dataclasses.dataclass
class Every:
    """Runs `fn(step, state, metrics)` every `every` steps, and at the last step when `at_end`."""

    every: int
    fn: Callable[[int, Any, Any], None]
    at_end: bool = True

    def __call__(self, step: int, state: Any, metrics: Any, *, final: bool) -> None:
        if (self.every > 0 and step % self.every == 0) or (final and self.at_end):
            self.fn(step, state, metrics)


class StopRequest:
    """Turns SIGTERM (and SIGINT) into a request to stop after the current step.

    The loop then writes a checkpoint of that step and returns normally, so a preempted job exits 0
    and its next start resumes from exactly there.
    """

    def __init__(self):
        self._event = threading.Event()
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}
        self._depth = 0  # entered by the job and again by the loop: install handlers once

    def _handle(self, signum, frame) -> None:
        self.signal_name = signal.Signals(signum).name
        self._event.set()

    def __enter__(self) -> "StopRequest":
        self._depth += 1
        if self._depth == 1 and threading.current_thread() is threading.main_thread():
            for signum in (signal.SIGTERM, signal.SIGINT):
                self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if self._depth == 0:
            for signum, handler in self._previous.items():
                signal.signal(signum, handler)
            self._previous.clear()

    @property
    def requested(self) -> bool:
        return self._event.is_set()

    def should_stop(self, step: int) -> bool:
        return self.requested


class StopSource(Protocol):
    """Decides after each step whether to stop there (a context manager around the loop).

    `StopRequest` for one process; several processes must agree on the step, see
    `bertjax.parallel.distributed.PreemptionSync`. A source whose `ends_run` is true when it
    stops (`bertjax.train.time_budget.BudgetStop`) ends the run there rather than pausing it.
    """

    signal_name: str | None

    def __enter__(self) -> "StopSource": ...

    def __exit__(self, *exc) -> None: ...

    def should_stop(self, step: int) -> bool: ...


def default_stop_source() -> StopSource:
    """A StopRequest for one process; with several, a stop at a step they all agree on."""
    return distributed.PreemptionSync() if distributed.is_multi_process() else StopRequest()


def run(state: Any, batches: Iterator[dict], *, start_step: int, total_steps: int,
        step_fn: Callable[[Any, dict], tuple[Any, Any]], hooks: Sequence[Hook],
        on_stop: Callable[[int, Any], None], progress: "Progress | None" = None,
        stop_source: StopSource | None = None) -> tuple[Any, int]:
    """Runs steps start_step+1 .. total_steps; returns (state, last step done).

    `step_fn(state, host_batch)` places the batch and runs the compiled step. `on_stop(step, state)`
    is called when a stop was requested (it should checkpoint), before returning early.
    `stop_source` (default: `default_stop_source()`) is asked after every step, the last one
    included.
    """
    step = start_step
    with (stop_source or default_stop_source()) as stop:
        while step < total_steps:
            batch = next(batches)
            state, metrics = step_fn(state, batch)
            step += 1
            stopping = stop.should_stop(step)
            # A stop that ends the run (a spent time budget) makes this its last step, hooks and
            # all; any other (a preemption) pauses it at a checkpoint.
            ends_run = stopping and getattr(stop, "ends_run", False)
            final = step == total_steps or ends_run
            for hook in hooks:
                hook(step, state, metrics, final=final)
            if progress is not None:
                progress.update(step)
            if stopping and (ends_run or not final):
                print(f"\n{stop.signal_name}: stopping after step {step}", file=sys.stderr)
                if not final:
                    on_stop(step, state)
                break
    if progress is not None:
        progress.close()
    return state, step


class Progress:
    """Progress on the terminal (process 0 only): a bar with tokens/s and ETA on a terminal, one
    plain line per logged step when stderr is a file (logs of batch jobs stay readable)."""

    def __init__(self, start_step: int, total_steps: int, enabled: bool = True):
        self._bar = None
        self._enabled = enabled
        self._total = total_steps
        self._start = start_step
        self._last = start_step
        self._started = time.perf_counter()
        if enabled and sys.stderr.isatty():
            self._bar = tqdm(total=total_steps, initial=start_step, unit="step", dynamic_ncols=True,
                             file=sys.stderr, mininterval=1.0, smoothing=0.1)

    def update(self, step: int) -> None:
        if self._bar is not None:
            self._bar.update(step - self._last)
        self._last = step

    def describe(self, step: int, **fields: float | str) -> None:
        shown = {k: (f"{v:.4g}" if isinstance(v, float) else v) for k, v in fields.items()}
        if self._bar is not None:
            self._bar.set_postfix(shown, refresh=False)
        elif self._enabled:
            elapsed = time.perf_counter() - self._started
            done = max(step - self._start, 1)
            eta = elapsed / done * (self._total - step)
            text = " ".join(f"{k}={v}" for k, v in shown.items())
            print(f"step {step}/{self._total} {text} eta={_duration(eta)}", file=sys.stderr,
                  flush=True)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
            self._bar = None


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    return f"{seconds // 3600}:{seconds // 60 % 60:02d}:{seconds % 60:02d}"
