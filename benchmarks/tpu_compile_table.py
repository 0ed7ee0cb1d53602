"""Compiles BERT pretraining steps for TPU slices on this CPU (`python -m bertjax.compile`, one
process a run) and prints a markdown table of the reports: the table of docs/tpu-compile.md.

    python benchmarks/tpu_compile_table.py [--out DIR] [--only SUBSTRING]

Each run's JSON report (or its refusal) is kept in DIR (default /tmp/tpu_compile_table), and a
run whose report is already there is not compiled again, so an interrupted table resumes.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys

PLATFORM = "configs/platform.py"
LENGTH = {128: ["--config.schedule.long_fraction=0"], 512: ["--config.schedule.long_fraction=1"]}


def runs() -> list[tuple[str, list[str]]]:
    """(label, command-line arguments) of every row: BERT-base and BERT-large (the tpu_v4_8
    preset, batch 256) at 128 and 512 tokens on one slice of each family."""
    rows = []
    for preset in ("base", "large"):
        for seq_len in (128, 512):
            for slice_ in ("v5e-8", "v4-8", "v5p-8"):
                rows.append((f"{preset} @ {seq_len} on {slice_}",
                             [f"--config={PLATFORM}:tpu_v4_8", f"--topology={slice_}",
                              f"--config.model.preset={preset}", *LENGTH[seq_len]]))
    return rows


def run_one(label: str, args: list[str], out: str) -> dict:
    path = os.path.join(out, label.replace(" ", "_").replace("@", "at") + ".json")
    if os.path.exists(path):
        with open(path) as f:
            return json.load(f)
    command = [sys.executable, "-m", "bertjax.compile", *args, "--json", path]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        result = {"refused": done.stderr.strip().splitlines()[-1] if done.stderr else "",
                  "exit": done.returncode}
        with open(path, "w") as f:
            json.dump(result, f)
        return result
    with open(path) as f:
        return json.load(f)


def rows_of(label: str, args: list[str], report: dict) -> list[str]:
    if "refused" in report:
        return [f"| {label} | - | - | no: {report['refused']} | | | | | |"]
    lines = []
    for p in report["phases"]:
        total, hbm = p["memory_bytes"]["total"] / 2**30, p["hbm_bytes"] / 2**30
        bound, estimate = p["roofline"]["bound"], p["roofline"]["estimate"]
        lines.append(
            f"| {label} | {p['seq_len']} x {p['batch']} | {total:.2f} / {hbm:g} GiB | yes | "
            f"{p['flops'] / 1e12:.3g} | {bound['step_s'] * 1e3:.1f} ms ({bound['limited_by']}) | "
            f"{100 * (bound['mfu_ceiling'] or 0):.0f}% | "
            f"{estimate['step_s'] * 1e3:.1f} ms ({estimate['limited_by']}), "
            f"{estimate['hbm_bytes'] / 2**30:.1f} GiB | "
            f"{100 * (estimate['mfu_estimate'] or 0):.0f}% | "
            f"{p['collective_bytes'] / 2**20:.0f} MiB |")
    return lines


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default="/tmp/tpu_compile_table")
    parser.add_argument("--only", default="", help="run only rows whose label contains this")
    options = parser.parse_args()
    os.makedirs(options.out, exist_ok=True)
    lines = ["| run | tokens x batch | HBM per chip | fits? | matmul TFLOP per chip a step | "
             "step time bound | MFU ceiling (bound) | step time estimate, HLO traffic | "
             "MFU estimate | collective bytes per chip a step |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for label, args in runs():
        if options.only in label:
            lines += rows_of(label, args, run_one(label, args, options.out))
            print(lines[-1], file=sys.stderr, flush=True)
    print("\n".join(lines))
    return 0


if __name__ == "__main__":
    sys.exit(main())
