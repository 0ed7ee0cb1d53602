"""Ahead-of-time compilation of a step for each batch shape, with its memory reported and checked.

Every phase of the length schedule is compiled before the first step, so a config whose 512-token
phase does not fit the device is refused at start-up, not after 90% of the run.
"""

from __future__ import annotations

import re
import sys
import time
from typing import Any, Callable

import jax

from bertjax.core.errors import UserError
from bertjax.data.schema import pretraining_batch_spec


# What the one-line refusal suggests (train.fit=auto tries these itself: memory_fit.py).
LEVERS = ("lower train.batch_size, raise train.accumulation_steps, set model.remat, or shard "
          "over more devices (mesh.fsdp)")


class DoesNotFit(UserError):
    """A compiled step larger than a device: its one line, and the bytes needed and held."""

    def __init__(self, name: str, needed: int, held: int, source: str):
        super().__init__(f"{name} needs {gib(needed)} per device but a device holds "
                         f"{gib(held)} ({source}): {LEVERS}")
        self.name, self.needed, self.held, self.source = name, needed, held, source
        self.phase: object = None  # the phase's key, set by memory_fit's search


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


def abstract_batch(global_batch: int, seq_len: int, max_predictions: int, *, nsp: bool,
                   span: bool, sharding=None, packed: bool = False) -> dict:
    """The batch (schema.py's) as abstract global arrays (`jax.ShapeDtypeStruct`), to compile a
    step for its shape."""
    spec = pretraining_batch_spec(global_batch, seq_len, max_predictions, nsp=nsp, span=span,
                                  packed=packed)
    return {key: jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)
            for key, (shape, dtype) in spec.items()}


def memory_report(compiled: Any) -> dict[str, int]:
    """Per-device bytes of a compiled computation (empty where the backend does not say)."""
    try:
        analysis = compiled.memory_analysis()
    except Exception:  # some backends raise instead of returning None
        return {}
    if analysis is None:
        return {}
    fields = ("argument_size_in_bytes", "output_size_in_bytes", "alias_size_in_bytes",
              "temp_size_in_bytes", "generated_code_size_in_bytes")
    report = {f.replace("_size_in_bytes", ""): int(getattr(analysis, f, 0) or 0) for f in fields}
    # Donated inputs alias outputs: count them once.
    report["peak"] = (report["argument"] + report["output"] - report["alias"] + report["temp"])
    return report


def device_memory_limit() -> int | None:
    """Bytes one device can hold, where the backend reports it (GPU, TPU); None on CPU."""
    try:
        stats = jax.local_devices()[0].memory_stats()
    except Exception:
        return None
    return int(stats["bytes_limit"]) if stats and "bytes_limit" in stats else None


def memory_limit(configured_gib: float = 0.0) -> tuple[int | None, str]:
    """(bytes per device, where that figure comes from): the configured GiB when positive, else
    what the device reports (None where it reports nothing, e.g. CPU)."""
    if configured_gib < 0:
        raise UserError(f"train.device_memory_gb must not be negative, got {configured_gib}")
    if configured_gib > 0:
        return int(configured_gib * 2**30), "train.device_memory_gb"
    return device_memory_limit(), "reported by the device"


def compile_step(jitted: Callable, *abstract_args: Any, name: str = "step",
                 verbose: bool = True, device_memory_gb: float = 0.0) -> Any:
    """Lowers and compiles `jitted` for these shapes; refuses a misfit (DoesNotFit); prints
    (`verbose`) the time and memory of a step that fits, a line also kept as `compiled.report`.
    A refusal is not preceded by the report: its one line names the figures.

    `device_memory_gb` > 0 sets the bytes a device holds (for devices that do not report it, or
    to leave headroom); 0 asks the device.
    """
    limit, source = memory_limit(device_memory_gb)
    started = time.perf_counter()
    lowered = jitted.lower(*abstract_args)
    try:
        compiled = lowered.compile()
    except jax.errors.JaxRuntimeError as e:
        # libtpu's compiler refuses a program larger than a chip's HBM itself, before the
        # comparison below can be made: the same refusal, with the figures it reports.
        sizes = out_of_hbm(str(e))
        if sizes is None:
            raise
        raise DoesNotFit(name, int(sizes[0] * 2**30), int(sizes[1] * 2**30),
                         "libtpu's compiler") from None
    seconds = time.perf_counter() - started
    report = memory_report(compiled)
    if limit is not None and report.get("peak", 0) > limit:
        raise DoesNotFit(name, report["peak"], limit, source)
    parts = [f"compiled {name} in {seconds:.1f}s"]
    if report:
        parts.append("memory per device: " + ", ".join(
            f"{k} {gib(v)}" for k, v in report.items() if k != "generated_code"))
    parts.append(f"device holds {gib(limit)} ({source})" if limit is not None
                 else "device memory unknown (set train.device_memory_gb to check it)")
    compiled.report = "; ".join(parts)  # type: ignore[attr-defined]
    if verbose:
        print(compiled.report, file=sys.stderr, flush=True)
    compiled.compile_seconds = seconds  # type: ignore[attr-defined]
    return compiled


def gib(n: int) -> str:
    """Bytes as GiB (MiB below a quarter GiB), as the reports and refusals print them."""
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"
