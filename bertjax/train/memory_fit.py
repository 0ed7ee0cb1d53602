"""train.fit=auto: the first setting of the memory levers under which every phase's step fits.

One setting for the whole run: the optimizer state's layout (which mesh.fsdp sets) is one for the
run, and one setting keeps a phase switch from changing how the step computes. The search, in
this order, stops at the first setting under which every phase fits:

  1. the config as given (or, resuming, the setting run.json records, where it saves more);
  2. model.remat towards less memory from the configured policy: save_dots, then full;
  3. with remat at the last of those: train.accumulation_steps doubled, while the micro-batch
     still splits over the mesh's batch (data x fsdp) shards, up to MAX_ACCUMULATION times the
     configured value, and while each doubling still lowers the need by MIN_GAIN or more (past
     that the activations are not what is too large);
  4. with remat and accumulation at the last tried: mesh.fsdp doubled, its devices taken from
     mesh.data, while mesh.data is even.

Levers only move from their configured values towards less memory: a policy, accumulation or
fsdp the config sets is a floor the search starts from, never undone. The config as given fits
when its peak is at most what a device holds (as with train.fit=off); a setting the search
chooses must leave HEADROOM: its peak at most 90% of it, the tenth kept for what the compiler's
analysis does not count. Each candidate compiles the phases longest first and is dropped at its
first misfit; the chosen candidate's compiled steps are the ones the run uses.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Callable, Sequence

from bertjax.core.errors import UserError
from bertjax.train.compilation import DoesNotFit, gib

MODES = ("auto", "off")
REMAT_ORDER = ("none", "save_dots", "full")  # less memory to the right
HEADROOM = 0.9
MAX_ACCUMULATION = 64
MIN_GAIN = 0.05


@dataclasses.dataclass(frozen=True)
class Levers:
    """The settings the search moves: model.remat, train.accumulation_steps and the mesh's
    (data, fsdp) sizes (data resolved: the devices it spans)."""
    remat: str
    accumulation: int
    fsdp: int
    data: int

    def settings(self) -> dict:
        return {"model.remat": self.remat, "train.accumulation_steps": self.accumulation,
                "mesh.fsdp": self.fsdp, "mesh.data": self.data}

    def changes(self, start: "Levers") -> dict:
        """The settings that differ from `start`'s."""
        before = start.settings()
        return {k: v for k, v in self.settings().items() if before[k] != v}

    def describe(self, start: "Levers") -> str:
        changed = self.changes(start)
        return ", ".join(f"{k}={v}" for k, v in changed.items()) or "as configured"

    def saving_more(self, other: "Levers") -> "Levers":
        """Each lever at whichever of the two saves more memory (the same devices assumed)."""
        remat = max(self.remat, other.remat, key=REMAT_ORDER.index)
        fsdp = self if self.fsdp >= other.fsdp else other
        return Levers(remat, max(self.accumulation, other.accumulation), fsdp.fsdp, fsdp.data)

    @classmethod
    def from_record(cls, record: dict) -> "Levers | None":
        """The levers of a run.json "fit" record; None for a record without them."""
        try:
            s = record["settings"]
            levers = cls(str(s["model.remat"]), int(s["train.accumulation_steps"]),
                         int(s["mesh.fsdp"]), int(s["mesh.data"]))
        except (KeyError, TypeError, ValueError):
            return None
        return levers if levers.remat in REMAT_ORDER else None


@dataclasses.dataclass
class Attempt:
    """One candidate: the phases compiled (key -> (compiled, peak bytes)) up to its first misfit."""
    levers: Levers
    compiled: dict
    misfit: DoesNotFit | None
    allowed: int | None  # the bytes its peak had to stay under (None: the device's limit)
    limit: int | None  # what a device holds

    @property
    def need(self) -> int:
        return self.misfit.needed if self.misfit else 0

    def line(self, start: Levers) -> str:
        m = self.misfit
        if m is None:
            return f"{self.levers.describe(start)}: fits"
        if self.allowed is None:
            return (f"{self.levers.describe(start)}: {m.name} needs {gib(m.needed)} but a "
                    f"device holds {gib(m.held)} ({m.source})")
        return (f"{self.levers.describe(start)}: {m.name} needs {gib(m.needed)}, over the "
                f"{gib(self.allowed)} allowed ({HEADROOM:.0%} of {gib(self.limit)})")


@dataclasses.dataclass
class Fit:
    """The setting chosen, its compiled steps (phase key -> compiled) and what was tried, each
    described by what it changes of the `configured` levers."""
    mode: str
    configured: Levers
    attempts: list[Attempt]
    limit: int | None

    @property
    def levers(self) -> Levers:
        return self.attempts[-1].levers

    @property
    def compiled(self) -> dict:
        return {key: compiled for key, (compiled, _) in self.attempts[-1].compiled.items()}

    def lines(self) -> list[str]:
        """What was tried and what was chosen ([] when the config as given fits)."""
        if len(self.attempts) == 1:
            return []
        tried = [f"fit: {a.line(self.configured)}" for a in self.attempts[:-1]]
        return tried + [f"fit: chose {self.levers.describe(self.configured)} (train.fit=auto): "
                        + self.phase_needs()]

    def phase_needs(self) -> str:
        peaks = self.attempts[-1].compiled
        return "; ".join(f"phase {key} needs {gib(peak)}" if peak is not None
                         else f"phase {key} compiled" for key, (_, peak) in peaks.items())

    def phase_line(self, key) -> str:
        """How phase `key` was made to fit, in a line."""
        failed = [a.line(self.configured) for a in self.attempts[:-1]
                  if a.misfit is not None and a.misfit.phase == key]
        _, peak = self.attempts[-1].compiled[key]
        chosen = self.levers.describe(self.configured)
        fits = ("fits as configured" if not self.levers.changes(self.configured)
                else f"fits with {chosen}") + (f" ({gib(peak)})" if peak is not None else "")
        return "; ".join(failed + [fits])

    def record(self) -> dict:
        """run.json's "fit": the settings the run trains with, and why."""
        return {"mode": self.mode, "settings": self.levers.settings(),
                "changed": self.levers.changes(self.configured), "tried": self.lines(),
                "limit_bytes": self.limit,
                "phases": {str(key): {"peak_bytes": peak, "line": self.phase_line(key)}
                           for key, (_, peak) in self.attempts[-1].compiled.items()}}


CompilePhase = Callable[[Levers, Any], tuple[Any, int | None]]


def search(start: Levers, phases: Sequence[tuple[Any, str]], compile_phase: CompilePhase, *,
           limit: int | None, batch_size: int, mode: str = "auto",
           configured: Levers | None = None) -> Fit:
    """The first candidate (module docstring) under which every phase fits. `phases`: (key,
    name) in the order to compile them (longest first); `compile_phase(levers, key)` returns
    (compiled, peak bytes or None) or raises DoesNotFit. Mode "off" tries the config as given
    only and raises its DoesNotFit; "auto" raises a UserError once every candidate failed.
    `configured`: the config's levers, where `start` differs (a resumed run's)."""
    attempts: list[Attempt] = []
    configured = configured or start

    def fits(levers: Levers) -> bool:
        allowed = None if not attempts or limit is None else int(HEADROOM * limit)
        attempts.append(_attempt(levers, phases, compile_phase, allowed, limit))
        if attempts[-1].misfit is None:
            return True
        attempts[-1].compiled = {}  # a candidate dropped: its steps are not kept
        return False

    if fits(start):
        return Fit(mode, configured, attempts, limit)
    if mode == "off":
        raise attempts[0].misfit
    for levers in _remat_steps(start):
        if fits(levers):
            return Fit(mode, configured, attempts, limit)
    levers = attempts[-1].levers
    while _splits(levers, batch_size) and levers.accumulation * 2 <= (
            MAX_ACCUMULATION * start.accumulation):
        before = attempts[-1].need
        levers = dataclasses.replace(levers, accumulation=levers.accumulation * 2)
        if fits(levers):
            return Fit(mode, configured, attempts, limit)
        if attempts[-1].need > (1 - MIN_GAIN) * before:
            break
    while levers.data % 2 == 0:
        levers = dataclasses.replace(levers, fsdp=levers.fsdp * 2, data=levers.data // 2)
        if fits(levers):
            return Fit(mode, configured, attempts, limit)
    last = attempts[-1]
    raise UserError(f"{last.misfit.name} does not fit with any setting train.fit=auto tried "
                    f"({len(attempts)}; the last, {last.line(configured)}): lower train.batch_size "
                    "or use devices with more memory (docs/pretraining.md)")


def _attempt(levers: Levers, phases, compile_phase: CompilePhase, allowed: int | None,
             limit: int | None) -> Attempt:
    compiled: dict = {}
    for key, name in phases:
        try:
            step, peak = compile_phase(levers, key)
        except DoesNotFit as misfit:
            misfit.phase = key
            return Attempt(levers, compiled, misfit, allowed, limit)
        if allowed is not None and peak is not None and peak > allowed:
            misfit = DoesNotFit(name, peak, allowed, f"{HEADROOM:.0%} of {gib(limit)}")
            misfit.phase = key
            return Attempt(levers, compiled, misfit, allowed, limit)
        compiled[key] = (step, peak)
    return Attempt(levers, compiled, None, allowed, limit)


def _remat_steps(start: Levers) -> list[Levers]:
    return [dataclasses.replace(start, remat=policy)
            for policy in REMAT_ORDER[REMAT_ORDER.index(start.remat) + 1:]]


def _splits(levers: Levers, batch_size: int) -> bool:
    """Whether the batch still splits into twice the micro-batches over the batch shards."""
    return batch_size % (levers.accumulation * 2 * levers.data * levers.fsdp) == 0
