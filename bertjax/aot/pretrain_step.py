"""The pretraining train step compiled for a TPU slice: the job's own step (pretrain_run.py's
model, optimizer, shardings, dtype, remat, accumulation and scan), one compile per length phase,
on a mesh of libtpu's compile-only devices.

XLA's cost analysis counts a while loop's body once (a step that scans its layers, or
accumulates micro-batches in a scan, reports about one layer's worth), so the FLOPs and bytes a
step are read from the compiled HLO instead (`hlo.analyse`), every loop body counted once per
iteration; XLA's own figure is kept beside them.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from bertjax.aot import hlo
from bertjax.bench.flops import xla_cost, xla_flops
from bertjax.data.length_schedule import Phase
from bertjax.jobs import common, pretrain_fit, pretraining_model
from bertjax.settings.pretrain import PretrainSettings
from bertjax.train import memory_fit
from bertjax.train.optimizer import make_optimizer
from bertjax.train.warm_start import UNTRAINED_POOLER


@dataclasses.dataclass
class Compiled:
    """One phase's compiled step and what the report needs beside it."""
    phase: Phase
    executable: Any
    program: hlo.Program         # per device, from the HLO: loop bodies once per iteration
    xla_flops_once: float | None  # XLA's own count: elementwise work too, loop bodies once
    xla_bytes_once: float | None
    model_flops: float           # model/flops.py's analytic count, the whole step, all devices
    state: Any = None            # the abstract train state and batch, shardings included
    batch: Any = None            # (aot/minimum_bytes.py)


class PretrainTarget:
    """The job's step built over `devices` (libtpu's), fitted (train.fit) and compiled phase by
    phase: `s`, `mesh` and `encoder` are those of the setting chosen, `fit` how it was chosen."""

    def __init__(self, s: PretrainSettings, devices: list, device_memory_gb: float):
        self.device_memory_gb = device_memory_gb
        micro = s.train.batch_size // s.train.accumulation_steps
        common.check_batch_split(s.mesh.make(devices), batch_size=micro)
        untrained = () if s.objective.nsp else (UNTRAINED_POOLER,)
        self.search = pretrain_fit.StepSearch(
            s, s.model.encoder(s.data.vocab_size), make_optimizer(s.optimizer,
                                                                  untrained=untrained),
            devices=devices, device_memory_gb=device_memory_gb)
        self._use(self.search.start)
        self.fit: memory_fit.Fit | None = None

    def _use(self, candidate: pretrain_fit.Candidate) -> None:
        self.s, self.mesh, self.encoder = candidate.s, candidate.mesh, candidate.encoder

    def compile_all(self) -> list[Compiled]:
        """Every phase's step under the setting train.fit chooses (refused, UserError, where
        none fits a chip); then the work of each."""
        self.fit, chosen = self.search.run(list(self.search.s.schedule.phases))
        self._use(chosen)
        return [dataclasses.replace(self._costs(phase, self.fit.compiled[phase.seq_len]),
                                    state=chosen.plan.abstract, batch=chosen.shapes(phase))
                for phase in self.s.schedule.phases]

    def _costs(self, phase: Phase, executable) -> Compiled:
        model_flops = pretraining_model.step_flops(self.s, self.encoder, phase)
        return Compiled(phase, executable, hlo.analyse(executable.as_text()),
                        xla_flops(executable), xla_cost(executable, "bytes accessed"),
                        model_flops)
