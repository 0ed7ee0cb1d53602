"""A compiled step's figures per chip, and the roofline bound they imply.

The bound is the step time no program can beat on that chip: the longest of its matmul FLOPs
(counted in the compiled HLO, rematerialized forward passes included) at the chip's peak, its
HBM traffic (estimated from the HLO) at the HBM bandwidth, and its collective bytes at the
chip's ICI bandwidth. Real steps are slower (no kernel runs at peak, the three overlap only in part), so its
tokens/s and MFU are ceilings, not predictions.
"""

from __future__ import annotations

from bertjax.aot import attention_report, hlo
from bertjax.aot.pretrain_step import Compiled
from bertjax.aot.topology import Slice
from bertjax.train.compilation import memory_report

GIB = 2.0 ** 30


def phase_report(c: Compiled, slice_: Slice, chips: int, batch: int) -> dict:
    """One phase's figures, per chip unless named otherwise."""
    memory = memory_report(c.executable)
    program = c.program
    collectives = program.collectives
    return {
        "seq_len": c.phase.seq_len, "max_predictions": c.phase.max_predictions,
        "batch": batch, "tokens_per_step": batch * c.phase.seq_len,
        "compile_s": round(c.executable.compile_seconds, 2),
        "memory_bytes": {"arguments": memory.get("argument", 0),
                         "outputs": memory.get("output", 0),
                         "donated": memory.get("alias", 0),
                         "temporaries": memory.get("temp", 0),
                         "total": memory.get("peak", 0)},
        "hbm_bytes": int(slice_.chip.hbm_gib * GIB),
        "flops": program.matmul_flops,
        "flops_method": "matmul FLOPs from the HLO (dots and convolutions, loop bodies once per "
                        "iteration, rematerialized forward passes included)",
        "xla_flops_loop_bodies_once": c.xla_flops_once,
        "model_flops_step_all_chips": c.model_flops,
        "bytes_accessed": program.traffic_bytes,
        "bytes_accessed_method": "estimate from the HLO: operands + results of every op outside "
                                 "a fusion, loop bodies once per iteration",
        "xla_bytes_accessed_loop_bodies_once": c.xla_bytes_once,
        "collectives": {kind: {"count": collectives.count[kind],
                               "bytes": collectives.bytes[kind]}
                        for kind in hlo.KINDS if collectives.count[kind]},
        "collective_bytes": collectives.total_bytes,
        "uncounted_loops": collectives.uncounted_loops,
        "roofline": roofline(c, slice_, chips, batch),
    }


def roofline(c: Compiled, slice_: Slice, chips: int, batch: int) -> dict:
    """The bound on the step time (an estimate from published peaks, not a measurement)."""
    chip, program = slice_.chip, c.program
    parts = {"compute_s": program.matmul_flops / (chip.peak_bf16_tflops * 1e12),
             "hbm_s": program.traffic_bytes / (chip.hbm_gb_per_s * 1e9),
             "ici_s": program.collectives.total_bytes / (chip.ici_gb_per_s * 1e9)}
    bound = max(parts.values())
    limited_by = max(parts, key=parts.get).removesuffix("_s")  # type: ignore[arg-type]
    tokens = batch * c.phase.seq_len
    return {**parts, "step_s_lower_bound": bound, "limited_by": limited_by,
            "tokens_per_s_ceiling": tokens / bound if bound else None,
            "mfu_ceiling": (c.model_flops / (bound * chips * chip.peak_bf16_tflops * 1e12)
                            if bound else None)}


def describe(report: dict) -> str:
    """The report as lines for a terminal."""
    chip = report["chip"]
    lines = [f"{report['config']} on {report['topology']} x {report['num_slices']} slice(s): "
             f"{report['chips']} chips ({chip['family']}: {chip['peak_bf16_tflops']:g} TFLOP/s "
             f"bf16, {chip['hbm_gib']:g} GiB HBM at {chip['hbm_gb_per_s']:g} GB/s, ICI "
             f"{chip['ici_gb_per_s']:g} GB/s), mesh {report['mesh']}; {report['model']}"]
    for p in report["phases"]:
        m, r = p["memory_bytes"], p["roofline"]
        xla = p["xla_flops_loop_bodies_once"]
        xla = "n/a" if xla is None else f"{xla / 1e12:.4g}"
        coll = ", ".join(f"{k} {v['count']} x = {v['bytes'] / 2**20:.1f} MiB"
                         for k, v in p["collectives"].items()) or "none"
        mfu = "n/a" if r["mfu_ceiling"] is None else f"{100 * r['mfu_ceiling']:.0f}%"
        tokens = r["tokens_per_s_ceiling"]
        lines += [
            f"phase {p['seq_len']} tokens, batch {p['batch']} (compiled in {p['compile_s']} s), "
            "per chip:",
            f"  HBM:         arguments {m['arguments'] / GIB:.2f} + outputs "
            f"{m['outputs'] / GIB:.2f} - donated {m['donated'] / GIB:.2f} + temporaries "
            f"{m['temporaries'] / GIB:.2f} = {m['total'] / GIB:.2f} GiB of "
            f"{p['hbm_bytes'] / GIB:g} GiB ({100 * m['total'] / p['hbm_bytes']:.0f}%)",
            f"  FLOPs:       {p['flops'] / 1e12:.4g} TFLOP a step (matmuls, from the HLO, "
            f"remat included); XLA's total {xla} (elementwise too, loop bodies once); "
            f"model {p['model_flops_step_all_chips'] / report['chips'] / 1e12:.4g} "
            "(bench/flops.py, analytic)",
            f"  HBM traffic: {p['bytes_accessed'] / GIB:.3g} GiB a step (estimate from the HLO)",
            f"  collectives: {coll} a step",
            f"  roofline:    step >= {r['step_s_lower_bound'] * 1e3:.2f} ms (bound, "
            f"{r['limited_by']}-limited: compute {r['compute_s'] * 1e3:.2f}, HBM "
            f"{r['hbm_s'] * 1e3:.2f}, ICI {r['ici_s'] * 1e3:.2f} ms) -> at most "
            + ("n/a" if tokens is None else f"{tokens:,.0f}") + f" tokens/s, MFU <= {mfu}",
        ]
    if "attention" in report:
        lines.append(attention_report.describe(report["attention"]))
    lines.append("estimates from the compiled HLO and published peaks, not measurements")
    return "\n".join(lines)
