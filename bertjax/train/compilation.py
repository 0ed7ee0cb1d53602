"""Ahead-of-time compilation of a step for each batch shape, with its memory reported and checked.

Every phase of the length schedule is compiled before the first step, so a config whose 512-token
phase does not fit the device is refused at start-up, not after 90% of the run.
"""

from __future__ import annotations

import sys
import time
from typing import Any, Callable

import jax

from bertjax.core.errors import UserError
from bertjax.data.schema import pretraining_batch_spec


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
    """Lowers and compiles `jitted` for these shapes; refuses a misfit; prints (`verbose`) the
    time and memory of a step that fits, a line also kept as `compiled.report`. A refusal is not
    preceded by the report: its one line names the figures.

    `device_memory_gb` > 0 sets the bytes a device holds (for devices that do not report it, or
    to leave headroom); 0 asks the device.
    """
    limit, source = memory_limit(device_memory_gb)
    started = time.perf_counter()
    compiled = jitted.lower(*abstract_args).compile()
    seconds = time.perf_counter() - started
    report = memory_report(compiled)
    if limit is not None and report.get("peak", 0) > limit:
        raise UserError(f"{name} needs {_gib(report['peak'])} per device but a device holds "
                        f"{_gib(limit)} ({source}): lower train.batch_size, raise "
                        "train.accumulation_steps, set model.remat, or shard over more devices "
                        "(mesh.fsdp)")
    parts = [f"compiled {name} in {seconds:.1f}s"]
    if report:
        parts.append("memory per device: " + ", ".join(
            f"{k} {_gib(v)}" for k, v in report.items() if k != "generated_code"))
    parts.append(f"device holds {_gib(limit)} ({source})" if limit is not None
                 else "device memory unknown (set train.device_memory_gb to check it)")
    compiled.report = "; ".join(parts)  # type: ignore[attr-defined]
    if verbose:
        print(compiled.report, file=sys.stderr, flush=True)
    compiled.compile_seconds = seconds  # type: ignore[attr-defined]
    return compiled


def _gib(n: int) -> str:
    return f"{n / 2**30:.2f} GiB" if n >= 2**28 else f"{n / 2**20:.1f} MiB"
