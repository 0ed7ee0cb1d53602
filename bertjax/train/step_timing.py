"""Step time, tokens/s and MFU of the steps between two logged ones, timed without a host
round-trip of their own.

Dispatch is asynchronous: only a value fetched from the device proves that a step has finished.
The logging hook fetches a window's metrics at each logged step anyway; the wall time between two
such fetches, over the steps in between, is the step time. Left out of it:

- the first step of each executable in this process (a run's or a resume's first step, the first
  of each length phase, fine-tuning's first batch of each length): it pays for loading the
  program, or compiling it. The timer waits for that step, once, and restarts its clock there;
  steps since the last logged one are then left out too, since their end is not known.
- host work between steps that is not training (evaluation, checkpoints, starting and stopping a
  profiler trace), run inside `paused()`: the steps before it finish first, then the clock pauses.

Everything else counts: waiting for the next batch, placing it, the step itself.
"""

from __future__ import annotations

import contextlib
import time
from typing import Any, Callable, Hashable, Iterator, Sequence

import jax

from bertjax.parallel import chips

# What a step record carries of the timing (absent where no step was timed; mfu where the
# devices' peak is known), and what depends on it (the data's wait, and the bytes a streamed
# corpus fetched by then: data/batch_iterator.py): readers comparing runs leave them out.
TIMING_FIELDS = ("step_time_s", "tokens_per_sec", "steps_per_sec", "mfu", "data_wait_s",
                 "data_bytes_fetched")


class StepTimer:
    """`tokens_in_step(step)`: the tokens a step trains on; `flops_in_step(step)`: its analytic
    model FLOPs on all devices (None: no MFU); `executable_of(step)`: which compiled program runs
    it; `peak_flops_per_s`: the devices' peak together (None: no MFU)."""

    def __init__(self, tokens_in_step: Callable[[int], int], *,
                 executable_of: Callable[[int], Hashable] = lambda step: None,
                 flops_in_step: Callable[[int], float] | None = None,
                 peak_flops_per_s: float | None = None):
        self._tokens_in_step = tokens_in_step
        self._executable_of = executable_of
        self._flops_in_step = flops_in_step if peak_flops_per_s else None
        self._peak = peak_flops_per_s
        self._seen: set = set()
        self._latest: Any = None
        self._pausing, self._pause_started = False, 0.0
        self._restart(time.perf_counter())

    def _restart(self, now: float) -> None:
        self._since, self._paused = now, 0.0
        self._steps, self._tokens, self._flops = 0, 0, 0.0

    def step(self, step: int, metrics: Any) -> None:
        """Counts a step just dispatched (after the previous window was fetched)."""
        self._latest = metrics
        executable = self._executable_of(step)
        if executable not in self._seen:
            self._seen.add(executable)
            jax.block_until_ready(metrics)  # once per program: its first run is not timed
            self._restart(time.perf_counter())
            return
        self._steps += 1
        self._tokens += self._tokens_in_step(step)
        if self._flops_in_step is not None:
            self._flops += self._flops_in_step(step)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """Host work that is not training: the steps dispatched so far finish first. Nested
        pauses count once."""
        if self._pausing:
            yield
            return
        if self._latest is not None:
            jax.block_until_ready(self._latest)
        self._pause_started, self._pausing = time.perf_counter(), True
        try:
            yield
        finally:
            self._paused += time.perf_counter() - self._pause_started
            self._pausing = False

    def fields(self) -> dict[str, float]:
        """The timed steps' figures since the last call, once their last step's values are on
        the host; {} when none was timed."""
        now = time.perf_counter()
        if self._pausing:  # fetched inside a pause: its part so far, then the rest afterwards
            self._paused += now - self._pause_started
            self._pause_started = now
        seconds = max(now - self._since - self._paused, 1e-9)
        fields: dict[str, float] = {}
        if self._steps:
            fields = {"step_time_s": seconds / self._steps,
                      "tokens_per_sec": self._tokens / seconds,
                      "steps_per_sec": self._steps / seconds}
            if self._flops_in_step is not None:
                fields["mfu"] = self._flops / seconds / self._peak
        self._restart(now)
        return fields


def peak_flops_per_s(devices: Sequence) -> float | None:
    """The devices' dense bf16 peak together, from bertjax/parallel/chips.py; None when their
    chip has no figures there (a CPU, a GPU)."""
    devices = list(devices)
    chip = chips.chip_of(devices[0].device_kind) if devices else None
    return chip.peak_bf16_tflops * 1e12 * len(devices) if chip else None
