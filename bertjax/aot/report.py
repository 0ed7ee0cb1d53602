"""A compiled step's figures per chip, and two roofline figures for its step time.

- The bound: the step time no program for this step can beat on that chip, from true minima
  only: the analytic model FLOPs at the chip's peak, the minimum HBM bytes (`minimum_bytes`) at
  its HBM bandwidth, the minimum collective bytes at its ICI bandwidth. Its MFU is the ceiling.
- The estimate: the compiled program op by op. Each op outside a fusion (a fusion, a copy, a
  collective's local part) takes max(its matmul FLOPs at the chip's peak, its HBM bytes at the
  HBM bandwidth), and the ops run one after another, as a TensorCore runs them; a Pallas
  kernel's matmuls, which the HLO does not show, add their analytic FLOPs at peak; the
  collectives' bytes at the ICI bandwidth overlap them (asynchronous collectives). Beside it the totals
  (matmul FLOPs, HBM traffic, collective bytes), the traffic by category and the largest
  fusions. Its MFU is what this program would reach with every op at the chip's peaks: an
  estimate, not a bound.

Real steps are slower than both (no kernel runs at peak; compute, HBM and ICI overlap in part).
"""

from __future__ import annotations

from bertjax.aot import attention_report, hlo, traffic_categories
from bertjax.aot.minimum_bytes import MinimumBytes
from bertjax.aot.pretrain_step import Compiled
from bertjax.aot.topology import Slice
from bertjax.train.compilation import memory_report

GIB = 2.0 ** 30


def phase_report(c: Compiled, slice_: Slice, chips: int, batch: int,
                 minimum: MinimumBytes) -> dict:
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
        "roofline": roofline(c, slice_, chips, batch, minimum),
    }


def _times(chip, flops: float, hbm: float, ici: float) -> dict:
    parts = {"compute_s": flops / (chip.peak_bf16_tflops * 1e12),
             "hbm_s": hbm / (chip.hbm_gb_per_s * 1e9),
             "ici_s": ici / (chip.ici_gb_per_s * 1e9)}
    step = max(parts.values())
    return {**parts, "step_s": step,
            "limited_by": max(parts, key=parts.get).removesuffix("_s")}  # type: ignore[arg-type]


def ops_in_sequence_s(chip, ops: list[hlo.OpBytes]) -> float:
    """The ops outside fusions one after another, each at its own roofline."""
    peak, bandwidth = chip.peak_bf16_tflops * 1e12, chip.hbm_gb_per_s * 1e9
    return sum(max(op.flops / peak, op.bytes / bandwidth) for op in ops)


def kernel_matmul_flops(c: Compiled, chips: int) -> float:
    """The matmul FLOPs a chip's Pallas kernels do (the splash attention's), which the HLO does
    not show (they run inside a custom call): the analytic count's excess over the HLO's, when
    the program calls a kernel. Taken at the chip's peak, after the other ops."""
    if not c.program.kernel_calls:
        return 0.0
    return max(0.0, c.model_flops / chips - c.program.matmul_flops)


def roofline(c: Compiled, slice_: Slice, chips: int, batch: int, minimum: MinimumBytes) -> dict:
    """The bound and the estimate (module docstring), from published peaks, not measurements.
    The top-level step_s_lower_bound, limited_by, tokens_per_s_ceiling, mfu_ceiling and the
    three times are the bound's."""
    chip, program = slice_.chip, c.program
    peak_all = chips * chip.peak_bf16_tflops * 1e12
    tokens = batch * c.phase.seq_len
    bound = _times(chip, c.model_flops / chips, minimum.hbm_total, minimum.collective)
    bound.update(hbm_bytes=minimum.hbm_total, hbm_bytes_by_category=minimum.hbm,
                 hbm_bytes_if_spilled=minimum.spilled,
                 collective_bytes=minimum.collective,
                 tokens_per_s_ceiling=tokens / bound["step_s"] if bound["step_s"] else None,
                 mfu_ceiling=(c.model_flops / (bound["step_s"] * peak_all)
                              if bound["step_s"] else None))
    kernel_flops = kernel_matmul_flops(c, chips)
    estimate = _times(chip, program.matmul_flops + kernel_flops, program.traffic_bytes,
                      program.collectives.total_bytes)
    in_sequence = (ops_in_sequence_s(chip, program.ops)
                   + kernel_flops / (chip.peak_bf16_tflops * 1e12))
    estimate.update(ops_in_sequence_s=in_sequence, step_s=max(in_sequence, estimate["ici_s"]),
                    limited_by="ops in sequence" if in_sequence >= estimate["ici_s"] else "ici",
                    kernel_flops=kernel_flops)
    sequences = minimum.sequences
    estimate.update(
        hbm_bytes=program.traffic_bytes,
        categories=traffic_categories.split(program.ops, sequences, sequences * c.phase.seq_len),
        top_fusions=traffic_categories.largest(program.ops),
        tokens_per_s=tokens / estimate["step_s"] if estimate["step_s"] else None,
        mfu_estimate=(c.model_flops / (estimate["step_s"] * peak_all)
                      if estimate["step_s"] else None))
    return {"compute_s": bound["compute_s"], "hbm_s": bound["hbm_s"], "ici_s": bound["ici_s"],
            "step_s_lower_bound": bound["step_s"], "limited_by": bound["limited_by"],
            "tokens_per_s_ceiling": bound["tokens_per_s_ceiling"],
            "mfu_ceiling": bound["mfu_ceiling"], "bound": bound, "estimate": estimate}


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
            "(model/flops.py, analytic)",
            f"  HBM traffic: {p['bytes_accessed'] / GIB:.3g} GiB a step (estimate from the HLO)",
            f"  collectives: {coll} a step",
            *_roofline_lines(r["bound"], r["estimate"]),
        ]
        fit = report.get("fit", {}).get("phases", {}).get(str(p["seq_len"]))
        if fit:  # train.fit: the settings tried for this phase and the one it fits with
            lines.append(f"  fit:         {fit['line']}")
    if "attention" in report:
        lines.append(attention_report.describe(report["attention"]))
    lines.append("estimates from the compiled HLO and published peaks, not measurements")
    return "\n".join(lines)


def _percent(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.0f}%"


def _times_text(t: dict) -> str:
    return (f"{t['step_s'] * 1e3:.2f} ms, {t['limited_by']}-limited: compute "
            f"{t['compute_s'] * 1e3:.2f}, HBM {t['hbm_s'] * 1e3:.2f}, ICI {t['ici_s'] * 1e3:.2f} ms")


def _roofline_lines(bound: dict, estimate: dict) -> list[str]:
    minimum = ", ".join(f"{k.replace('_', ' ')} {v / GIB:.2f}"
                        for k, v in bound["hbm_bytes_by_category"].items())
    found = ", ".join(f"{k.replace('_', ' ')} {v / GIB:.2f}"
                      for k, v in estimate["categories"].items())
    top = "; ".join(f"{f['name']} {f['bytes'] / GIB:.2f} "
                    f"({'/'.join(f['op_name'].rsplit('/', 2)[-2:])})"
                    for f in estimate["top_fusions"][:5])
    return [
        f"  bound:       step >= {_times_text(bound)} (model FLOPs, minimum HBM bytes "
        f"{bound['hbm_bytes'] / GIB:.2f} GiB, minimum collective bytes "
        f"{bound['collective_bytes'] / 2**20:.0f} MiB) -> MFU ceiling "
        f"{_percent(bound['mfu_ceiling'])}",
        f"    minimum HBM GiB: {minimum}",
        f"  estimate:    step ~ {estimate['step_s'] * 1e3:.2f} ms, {estimate['limited_by']} "
        f"(each op of the HLO at its own roofline, one after another "
        f"{estimate['ops_in_sequence_s'] * 1e3:.2f} ms; the totals alone: compute "
        f"{estimate['compute_s'] * 1e3:.2f}, HBM {estimate['hbm_s'] * 1e3:.2f}, ICI "
        f"{estimate['ici_s'] * 1e3:.2f} ms) -> MFU estimate {_percent(estimate['mfu_estimate'])}",
        f"    HLO traffic GiB: {found}",
        f"    largest fusions GiB: {top}",
    ]
