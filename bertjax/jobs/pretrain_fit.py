"""The pretraining step under train.fit: each setting of the memory levers that memory_fit.py's
search tries, built into the job's own step (the settings, mesh, model with that remat, state
plan and accumulation) and compiled per length phase. The job (pretrain_run.py) and the TPU
compile (aot/pretrain_step.py) both fit their steps here."""

from __future__ import annotations

import dataclasses
import sys

from bertjax.data.length_schedule import Phase
from bertjax.jobs import pretraining_model
from bertjax.parallel import partitioning
from bertjax.settings.pretrain import PretrainSettings
from bertjax.train import memory_fit
from bertjax.train.compilation import abstract_batch, compile_step, memory_limit, memory_report
from bertjax.train.memory_fit import Levers
from bertjax.train.state import StatePlan
from bertjax.train.step import make_train_step

RECORD_KEY = "fit"  # run.json's key for the setting chosen (memory_fit.Fit.record)


def with_levers(s: PretrainSettings, levers: Levers) -> PretrainSettings:
    """`s` with the levers' remat, accumulation and mesh (data, fsdp) sizes."""
    return dataclasses.replace(
        s, model=dataclasses.replace(s.model, remat=levers.remat),
        train=dataclasses.replace(s.train, accumulation_steps=levers.accumulation),
        mesh=dataclasses.replace(s.mesh, data=levers.data, fsdp=levers.fsdp))


class Candidate:
    """The job's step under one setting of the levers: what a run trains with once chosen."""

    def __init__(self, s: PretrainSettings, levers: Levers, encoder, optimizer, devices=None):
        self.s, self.levers, self.optimizer = with_levers(s, levers), levers, optimizer
        self.mesh = self.s.mesh.make(devices)
        self.encoder = encoder.replace(remat=levers.remat)
        self.model, self.objective = pretraining_model.build(self.s, self.encoder)
        # A phase with its own rotary base runs the same parameters through another model.
        self.phase_models = {phase.seq_len: pretraining_model.build(
            self.s, self.encoder.replace(rope_theta=phase.rope_theta))[0]
            if phase.rope_theta else self.model for phase in s.schedule.phases}
        self.batch_sharding = partitioning.batch_sharding(self.mesh)
        self.plan = StatePlan(self.model, optimizer, self.shapes(s.schedule.phase_at(0)),
                              self.mesh, s.train.seed)

    def shapes(self, phase: Phase) -> dict:
        s = self.s
        return abstract_batch(s.train.batch_size, phase.seq_len, phase.max_predictions,
                              nsp=s.objective.nsp, span=s.masking.strategy == "span",
                              packed=s.objective.mode == "documents", sharding=self.batch_sharding)

    def compile(self, phase: Phase, device_memory_gb: float):
        """(compiled step, its peak bytes per device or None); DoesNotFit if over the device."""
        step = make_train_step(self.phase_models[phase.seq_len], self.optimizer, self.mesh,
                               self.plan.shardings, accumulation_steps=self.levers.accumulation,
                               objective=self.objective)
        compiled = compile_step(step, self.plan.abstract, self.shapes(phase),
                                name=f"train step at {phase.seq_len} tokens", verbose=False,
                                device_memory_gb=device_memory_gb)
        return compiled, memory_report(compiled).get("peak")


class StepSearch:
    """The candidates of one job: `start` (the config's levers, or with train.fit=auto those
    `recorded` in run.json where they save more), then `run` for the phases to compile."""

    def __init__(self, s: PretrainSettings, encoder, optimizer, *, devices=None,
                 device_memory_gb: float = 0.0, recorded: dict | None = None):
        self.s, self.encoder, self.optimizer, self.devices = s, encoder, optimizer, devices
        self.device_memory_gb, self.recorded = device_memory_gb, recorded or {}
        mesh = s.mesh.make(devices)
        self.configured = Levers(s.model.remat, s.train.accumulation_steps,
                                 mesh.shape["fsdp"], mesh.shape["data"])
        start = self.configured
        saved = Levers.from_record(self.recorded)
        if s.train.fit == "auto" and saved is not None and (
                saved.data * saved.fsdp == start.data * start.fsdp):  # the same devices
            start = start.saving_more(saved)
        self._candidates: dict[Levers, Candidate] = {}
        self.start = self.candidate(start)

    def candidate(self, levers: Levers) -> Candidate:
        if levers not in self._candidates:
            self._candidates[levers] = Candidate(self.s, levers, self.encoder, self.optimizer,
                                                 self.devices)
        return self._candidates[levers]

    def run(self, phases: list[Phase]) -> tuple[memory_fit.Fit, Candidate]:
        """The fit for `phases` (compiled longest first) and the candidate chosen."""
        by_length = {phase.seq_len: phase for phase in phases}
        ordered = sorted(by_length, reverse=True)
        limit, _ = memory_limit(self.device_memory_gb)
        fit = memory_fit.search(
            self.start.levers, [(n, f"train step at {n} tokens") for n in ordered],
            lambda levers, n: self.candidate(levers).compile(by_length[n],
                                                             self.device_memory_gb),
            limit=limit, batch_size=self.s.train.batch_size, mode=self.s.train.fit,
            configured=self.configured)
        return fit, self.candidate(fit.levers)

    def resumed_line(self) -> str | None:
        """The line a run prints when it takes run.json's setting over the config's."""
        if self.start.levers == self.configured:
            return None
        return (f"fit: {self.start.levers.describe(self.configured)}, as run.json records "
                "(train.fit=auto keeps a run's setting when it resumes)")

    def record(self, fit: memory_fit.Fit) -> dict:
        """run.json's "fit"; a resumed run that tried nothing new keeps why it was chosen."""
        record = fit.record()
        if not record["tried"] and self.start.levers != self.configured:
            record["tried"] = self.recorded.get("tried", [])
        return record


def print_lines(lines: list[str]) -> None:
    for line in lines:
        print(line, file=sys.stderr, flush=True)
