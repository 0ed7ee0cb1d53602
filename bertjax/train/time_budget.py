"""Pretraining for a wall-clock budget: a clock that survives resumes, the learning rate laid over
the budget, a stop when it is spent, and checkpoints every so many minutes.

With `train.time_budget_minutes`, the schedule's clock is time, not steps (Geiping & Goldstein's
cramming): the schedule built from the optimizer keys is read at the virtual step
`fraction spent x train.steps`, so `optimizer.warmup_steps / train.steps` is the share of the
budget spent warming up, and the decay reaches its end as the budget runs out, however fast the
machine turns out to be. `train.steps` stays a cap. The host sets the rate into the optimizer
state before each step (`make_optimizer(..., host_rate=True)`): the compiled step takes no extra
argument and the state keeps its layout. Such a run depends on the machine's speed, so unlike a
step-scheduled run it does not resume bit for bit; its clock does resume (saved with each
checkpoint), so a preempted run spends what is left of the budget, not a new one.
"""

from __future__ import annotations

import time
from typing import Any, Callable

import jax
import numpy as np
import optax

from bertjax.train.optimizer import LearningRateState

# The data state saved with a checkpoint carries the clock under this key.
SPENT_KEY = "time_budget_spent_s"


class BudgetClock:
    """Seconds spent by the run, earlier processes of it included."""

    def __init__(self, budget_s: float, spent_before_s: float = 0.0):
        self.budget_s = budget_s
        self.spent_before_s = spent_before_s
        self._started = time.perf_counter()

    def resume_from(self, spent_before_s: float) -> None:
        """Counts on from a checkpoint's clock; this process's time so far is kept."""
        self.spent_before_s = spent_before_s

    def spent(self) -> float:
        return self.spent_before_s + time.perf_counter() - self._started

    def fraction(self) -> float:
        return min(self.spent() / self.budget_s, 1.0) if self.budget_s > 0 else 0.0

    @property
    def exhausted(self) -> bool:
        return self.budget_s > 0 and self.spent() >= self.budget_s


class BudgetRate:
    """The learning rate at the budget's current fraction, set into the state before a step."""

    def __init__(self, schedule: optax.Schedule, total_steps: int, clock: BudgetClock):
        self.schedule, self.total_steps, self.clock = schedule, total_steps, clock

    def rate(self) -> float:
        return float(self.schedule(np.float32(self.clock.fraction() * self.total_steps)))

    def apply(self, state: Any) -> Any:
        rate = self.rate()

        def set_rate(leaf):
            if not isinstance(leaf, LearningRateState):
                return leaf
            value = jax.device_put(np.float32(rate), leaf.learning_rate.sharding)
            return leaf._replace(learning_rate=value)

        opt_state = jax.tree.map(set_rate, state.opt_state,
                                 is_leaf=lambda x: isinstance(x, LearningRateState))
        return state.replace(opt_state=opt_state)


class BudgetStop:
    """A loop stop source that also stops once the budget is spent (the loop then checkpoints
    that step, as for a preemption)."""

    def __init__(self, inner, clock: BudgetClock):
        self.inner, self.clock = inner, clock
        self._budget_spent = False

    @property
    def signal_name(self) -> str | None:
        return "time budget spent" if self._budget_spent else self.inner.signal_name

    @property
    def budget_spent(self) -> bool:
        return self._budget_spent

    @property
    def ends_run(self) -> bool:
        """The loop makes a step after which the budget is spent the run's last."""
        return self._budget_spent

    def __enter__(self) -> "BudgetStop":
        self.inner.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self.inner.__exit__(*exc)

    @property
    def requested(self) -> bool:
        return self.inner.requested

    def should_stop(self, step: int) -> bool:
        if self.inner.should_stop(step):
            return True
        self._budget_spent = self.clock.exhausted
        return self._budget_spent


class EveryMinutes:
    """A hook that runs `fn(step, state, metrics)` after the first step at or past each multiple
    of `minutes` on the clock (not at the end: the loop's own last checkpoint covers that)."""

    def __init__(self, minutes: float, clock: BudgetClock, fn: Callable[[int, Any, Any], None]):
        self.seconds, self.clock, self.fn = minutes * 60.0, clock, fn
        self._next: float | None = None

    def __call__(self, step: int, state: Any, metrics: Any, *, final: bool) -> None:
        if self.seconds <= 0 or final:
            return
        spent = self.clock.spent()
        if self._next is None:  # a resumed clock's next multiple, not the first
            self._next = (int(self.clock.spent_before_s // self.seconds) + 1) * self.seconds
        if spent >= self._next:
            self.fn(step, state, metrics)
            self._next = (int(spent // self.seconds) + 1) * self.seconds
