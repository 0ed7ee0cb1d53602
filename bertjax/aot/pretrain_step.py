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
import re
from typing import Any

import jax

from bertjax.aot import hlo
from bertjax.bench.flops import xla_cost, xla_flops
from bertjax.core.errors import UserError
from bertjax.data.length_schedule import Phase
from bertjax.jobs import common, pretraining_model
from bertjax.parallel import partitioning
from bertjax.settings.pretrain import PretrainSettings
from bertjax.train.compilation import abstract_batch, compile_step
from bertjax.train.optimizer import make_optimizer
from bertjax.train.state import StatePlan
from bertjax.train.step import make_train_step
from bertjax.train.warm_start import UNTRAINED_POOLER


@dataclasses.dataclass
class Compiled:
    """One phase's compiled step and what the report needs beside it."""
    phase: Phase
    executable: Any
    program: hlo.Program         # per device, from the HLO: loop bodies once per iteration
    xla_flops_once: float | None  # XLA's own count: elementwise work too, loop bodies once
    xla_bytes_once: float | None
    model_flops: float           # bench/flops.py's analytic count, the whole step, all devices
    state: Any = None            # the abstract train state and batch, shardings included
    batch: Any = None            # (aot/minimum_bytes.py)


# libtpu's words for a program that does not fit, e.g. "... required for HLO temporaries
# (309.71G) exceeds available HBM (15.75G)": its sizes carry a binary unit (B, K, M, G, T, P).
_SIZE = r"([\d.]+)([KMGTP]?)B?"
_OUT_OF_HBM = (re.compile(rf"\({_SIZE}\) exceeds available HBM \({_SIZE}\)"),
               re.compile(rf"Used {_SIZE} of {_SIZE} hbm"))
_UNIT_GIB = {"": 2.0 ** -30, "K": 2.0 ** -20, "M": 2.0 ** -10, "G": 1.0, "T": 2.0 ** 10,
             "P": 2.0 ** 20}


def out_of_hbm(message: str) -> tuple[float, float] | None:
    """(GiB needed, GiB a chip holds) from libtpu's out-of-memory refusal; None for any other
    error."""
    found = next((f for f in (p.search(message) for p in _OUT_OF_HBM) if f), None)
    if found is None:
        return None
    needed, needed_unit, held, held_unit = found.groups()
    return float(needed) * _UNIT_GIB[needed_unit], float(held) * _UNIT_GIB[held_unit]


class PretrainTarget:
    """The job's step built over `devices` (libtpu's), compiled phase by phase."""

    def __init__(self, s: PretrainSettings, devices: list, device_memory_gb: float):
        self.s, self.device_memory_gb = s, device_memory_gb
        self.mesh = s.mesh.make(devices)
        micro = s.train.batch_size // s.train.accumulation_steps
        common.check_batch_split(self.mesh, batch_size=micro)
        self.encoder = s.model.encoder(s.data.vocab_size)
        untrained = () if s.objective.nsp else (UNTRAINED_POOLER,)
        self.optimizer = make_optimizer(s.optimizer, untrained=untrained)
        self.sharding = partitioning.batch_sharding(self.mesh)

    def shapes(self, phase: Phase) -> dict:
        s = self.s
        return abstract_batch(s.train.batch_size, phase.seq_len, phase.max_predictions,
                              nsp=s.objective.nsp, span=s.masking.strategy == "span",
                              packed=s.objective.mode == "documents", sharding=self.sharding)

    def _step(self, encoder, accumulation: int):
        model, objective = pretraining_model.build(self.s, encoder)
        first = self.shapes(self.s.schedule.phases[0])
        plan = StatePlan(model, self.optimizer, first, self.mesh, self.s.train.seed)
        abstract, shardings = plan.abstract, plan.shardings
        return make_train_step(model, self.optimizer, self.mesh, shardings,
                               accumulation_steps=accumulation, objective=objective), abstract

    def compile_all(self) -> list[Compiled]:
        """Every phase's step, each refused (UserError, training's one line) if it does not fit
        a chip; then the work of each."""
        step, abstract = self._step(self.encoder, self.s.train.accumulation_steps)
        compiled = [(phase, self._compile(step, abstract, phase))
                    for phase in self.s.schedule.phases]
        return [dataclasses.replace(self._costs(phase, executable), state=abstract,
                                    batch=self.shapes(phase))
                for phase, executable in compiled]

    def _compile(self, step, abstract, phase: Phase):
        name = f"train step at {phase.seq_len} tokens"
        try:
            return compile_step(step, abstract, self.shapes(phase), name=name, verbose=False,
                                device_memory_gb=self.device_memory_gb)
        except jax.errors.JaxRuntimeError as e:
            # libtpu's compiler refuses a program larger than a chip's HBM itself, before
            # compile_step can compare: the same refusal, in training's words.
            sizes = out_of_hbm(str(e))
            if sizes is None:
                raise
            raise UserError(
                f"{name} needs {sizes[0]:.2f} GiB per device but a device holds "
                f"{sizes[1]:.2f} GiB (libtpu's compiler): lower train.batch_size, raise "
                "train.accumulation_steps, set model.remat, or shard over more devices "
                "(mesh.fsdp)") from None

    def _costs(self, phase: Phase, executable) -> Compiled:
        model_flops = pretraining_model.step_flops(self.s, self.encoder, phase)
        return Compiled(phase, executable, hlo.analyse(executable.as_text()),
                        xla_flops(executable), xla_cost(executable, "bytes accessed"),
                        model_flops)
