"""`python -m bertjax.bench`: compile time, step time, tokens/s, TFLOP/s, MFU and peak memory of
the pretraining train step; with --compare-torch, transformers' PyTorch BertForPreTraining timed
in the same run on the same batch. `--task finetune` times an epoch of fine-tuning on the
config's training data instead (bertjax.bench.finetune_epoch).

    python -m bertjax.bench --config=configs/base.py [--config.KEY=VALUE ...] [--seq-len 128]
        [--batch 8] [--predictions P] [--steps 5] [--warmup 2] [--compare-torch]
        [--torch-bf16] [--peak-tflops X] [--json OUT]
    python -m bertjax.bench --task finetune --config=configs/finetune_sentiment.py
        --config.init_checkpoint=DIR [--examples 3000] [--compare-torch] [--torch-bf16]

With --compare-torch the two steps are timed alternately (ours, theirs, ours, ...), so a change
in the machine's load during the run falls on both alike.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import sys
import time
from typing import Callable

import jax

from bertjax import settings
from bertjax.bench import finetune_epoch, flops
from bertjax.bench.jax_step import JaxStep, Workload, process_peak_rss
from bertjax.bench.torch_peer import TorchStep, check_objective, peer_libraries
from bertjax.cli import entry
from bertjax.cli.config_flags import parse_config
from bertjax.core import json_records, output_dir, storage
from bertjax.core.errors import EXIT_BAD_INPUT, UserError, report
from bertjax.settings import FinetuneSettings, PretrainSettings
from bertjax.settings import pretrain as pretrain_settings

USAGE = ("python -m bertjax.bench --config=configs/base.py [--config.KEY=VALUE ...] "
         "[options]")


def _at_least(kind: type, minimum: float) -> Callable[[str], float]:
    def parse(text: str):
        try:
            value = kind(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not a number: {text!r}") from None
        if not value >= minimum or (kind is float and not math.isfinite(value)):
            raise argparse.ArgumentTypeError(f"must be at least {minimum}, got {text}")
        return value

    return parse


def parse_args(argv: list[str]):
    """(bench options, settings) from the command line; a bad flag or config is a UserError."""
    parser = entry.ArgumentParser(prog="python -m bertjax.bench", usage=USAGE, allow_abbrev=False,
                                  description=__doc__.split("\n\n")[0])
    parser.add_argument("--task", choices=("pretrain", "finetune"), default="pretrain",
                        help="what to time: the pretraining step, or an epoch of fine-tuning")
    parser.add_argument("--examples", type=_at_least(int, 1),
                        help="--task finetune: training rows (default: the config's limit)")
    parser.add_argument("--torch-bf16", action="store_true",
                        help="run the transformers peer under torch.autocast(bfloat16)")
    parser.add_argument("--seq-len", type=_at_least(int, 8),
                        help="tokens a sequence (default: the length the config's schedule "
                             "starts with, schedule.short_seq_len)")
    parser.add_argument("--batch", type=_at_least(int, 1), default=8, help="global batch size")
    parser.add_argument("--predictions", type=_at_least(int, 1),
                        help="masked positions a sequence (default: the config's schedule value "
                             "for this length, else ceil(masking.mask_prob * seq_len))")
    parser.add_argument("--steps", type=_at_least(int, 1), default=5, help="timed steps")
    parser.add_argument("--warmup", type=_at_least(int, 0), default=2,
                        help="untimed steps after compiling (ours always runs at least one, "
                             "for the memory figures)")
    parser.add_argument("--compare-torch", action="store_true",
                        help="also time transformers' PyTorch BertForPreTraining (fp32; on the "
                             "GPU when our step runs on one, else the CPU)")
    parser.add_argument("--peak-tflops", type=_at_least(float, 1e-9),
                        help="peak TFLOP/s of one device for MFU (default: the bf16 table)")
    parser.add_argument("--json", metavar="OUT", help="also write every figure to this file")
    options, rest = parser.parse_known_args(argv[1:])
    stray = [arg for arg in rest if not arg.startswith("--config")]
    if stray:
        raise UserError(f"bad flags: unexpected {' '.join(stray)} (the config is given as "
                        "--config=FILE, its settings as --config.KEY=VALUE)")
    if options.json:
        _check_output(options.json)
    config, _ = parse_config([argv[0], *rest])
    return options, read_settings(options.task, config)


def read_settings(task: str, config) -> PretrainSettings | FinetuneSettings:
    """The config's settings, read as its job reads them; a config of a task the benchmark does
    not time is refused by name."""
    if task == "finetune":
        finetune_epoch.check_task(settings.task_of(config))
        return settings.read(config)
    return pretrain_settings.read(config)


def _is_report(path: str) -> bool:
    try:
        found = json_records.read_object(path)
    except json_records.NotAnObject:
        return False
    return "tokens_per_s" in found or "epochs" in found


# What --json writes, and so the only file it replaces (a report of an earlier benchmark).
REPORT = output_dir.Kind("bertjax.bench report", directory=False, holds=_is_report)


def _check_output(path: str) -> None:
    if not storage.is_url(path):
        directory = os.path.dirname(os.path.abspath(path))
        if os.path.isdir(path):
            raise UserError(f"--json {path} is a directory; give a file name")
        if not os.path.isdir(directory) or not os.access(directory, os.W_OK):
            raise UserError(f"--json {path}: directory {directory} does not exist or is not "
                            "writable")
    output_dir.check_target(path, overwrite=True, kind=REPORT)


def _write_report(path: str, result: dict) -> None:
    with output_dir.staged_file(path, overwrite=True, kind=REPORT, mode="w") as f:
        f.write(json.dumps(result, indent=2) + "\n")


def default_predictions(s: PretrainSettings, seq_len: int) -> int:
    """The schedule's prediction budget for this length, else the masking probability's share."""
    for phase in s.schedule.phases:
        if phase.seq_len == seq_len:
            return phase.max_predictions
    return math.ceil(s.masking.mask_prob * seq_len)


def time_steps(steps: list[Callable[[], None]], warmups: list[int],
               timed: int) -> list[dict[str, float]]:
    """Each stepper's step-time statistics: warm each up, then time them round-robin.

    `cores_busy` is this process's CPU time over wall time during the timed steps: on a quiet
    machine it shows how many cores a step keeps busy; well under the cores a step can use, it
    flags other work competing for them.

    With several steppers, each timed step follows an untimed step of the same stepper: the
    first step after the other framework ran is slower for both (measured, BERT-base 8 x 128 on
    2 cores: ours 5.6-5.9 s against 3.9-4.1 s for the steps after it), because the other's
    freed memory must be faulted in again and its idle workers may still spin. A training run
    never switches, so the steady state is what is timed.
    """
    for step, warmup in zip(steps, warmups):
        for _ in range(warmup):
            step()
    wall: list[list[float]] = [[] for _ in steps]
    cpu = [0.0 for _ in steps]
    for _ in range(timed):
        for i, step in enumerate(steps):
            if len(steps) > 1:
                step()
            started, cpu_started = time.perf_counter(), time.process_time()
            step()
            wall[i].append(time.perf_counter() - started)
            cpu[i] += time.process_time() - cpu_started
    return [{"step_s": statistics.median(w), "step_s_min": min(w), "step_s_max": max(w),
             "cores_busy": c / sum(w)} for w, c in zip(wall, cpu)]


def run(options, s: PretrainSettings | FinetuneSettings) -> dict:
    """Builds our step (and the peer's), times them, and returns every figure."""
    if options.compare_torch:
        peer_libraries()  # without the hf extra, refused before anything is built
    if options.task == "finetune":
        return finetune_epoch.run(options, s)
    if options.compare_torch:
        check_objective(s.objective.name)
    seq_len = options.seq_len or s.schedule.phases[0].seq_len
    predictions = options.predictions or default_predictions(s, seq_len)
    ours = JaxStep(s, Workload(options.batch, seq_len, predictions))
    peer = None
    if options.compare_torch:
        o = s.optimizer
        peer = TorchStep(ours.encoder, ours.batch_np, learning_rate=o.learning_rate,
                         weight_decay=o.weight_decay, betas=(o.b1, o.b2), eps=o.eps,
                         clip_norm=o.clip_norm, seed=s.train.seed, bf16=options.torch_bf16,
                         device="cuda" if jax.default_backend() == "gpu" else "cpu")
    # One step of ours first (a warmup step when --warmup > 0): its memory figures are read
    # before the peer's first step can raise the process's RSS mark.
    ours.step()
    memory = (*ours.peak_memory(), process_peak_rss())
    steppers = [ours.step] + ([peer.step] if peer else [])
    warmups = [max(options.warmup - 1, 0)] + ([options.warmup] if peer else [])
    timings = time_steps(steppers, warmups, options.steps)
    result = figures(options, s, ours, timings[0], memory)
    if peer is not None:
        theirs = timings[1]
        result["torch"] = {**theirs, "tokens_per_s": ours.workload.tokens / theirs["step_s"],
                           "params": peer.params, "threads": peer.threads,
                           "device": peer.device,
                           "attention": peer.attention, "loss": peer.last_loss(),
                           "precision": "bf16 autocast" if options.torch_bf16 else "fp32",
                           **peer.versions}
        result["speedup_vs_torch"] = result["tokens_per_s"] / result["torch"]["tokens_per_s"]
    return result


def figures(options, s: PretrainSettings, ours: JaxStep, timing: dict,
            memory: tuple[int, str, int]) -> dict:
    """Our step's figures: the setting, the timings, FLOPs and MFU, memory."""
    device = jax.devices()[0]
    workload, model_flops, devices = ours.workload, ours.flops.total, ours.mesh.devices.size
    peak = options.peak_tflops or flops.peak_tflops(device.device_kind)
    achieved = model_flops / timing["step_s"] / 1e12
    return {
        "preset": s.model.preset, "objective": s.objective.name,
        "dtype": ours.encoder.dtype, "scan_layers": ours.encoder.scan_layers,
        "remat": ours.encoder.remat, "params": ours.params,
        "platform": device.platform, "device_kind": device.device_kind, "devices": devices,
        "jax": jax.__version__, "xla_flags": os.environ.get("XLA_FLAGS", ""),
        "batch": workload.batch, "seq_len": workload.seq_len,
        "predictions": workload.predictions, "warmup": options.warmup, "steps": options.steps,
        "compile_s": ours.compile_seconds, **timing,
        "load_average_1m": os.getloadavg()[0],
        "tokens_per_s": workload.tokens / timing["step_s"],
        "model_tflop_per_step": model_flops / 1e12,
        "model_tflop_parts": {k: v / 1e12 for k, v in vars(ours.flops).items()},
        # Per device: under SPMD, XLA analyses the program one device runs.
        "xla_tflop_per_device_step": None if ours.xla_flops is None else ours.xla_flops / 1e12,
        "model_tflops_per_s": achieved,
        "peak_tflops_per_device": peak,
        "peak_source": "--peak-tflops" if options.peak_tflops else (
            "bf16 table" if peak else None),
        "mfu": achieved / (peak * devices) if peak else None,
        "peak_memory_bytes": memory[0], "peak_memory_source": memory[1],
        "process_peak_rss_bytes": memory[2], "loss": ours.last_loss(),
    }


def describe(r: dict) -> str:
    """The figures as a few readable lines."""
    gib = 2.0 ** 30
    xla = r["xla_tflop_per_device_step"]
    xla = "n/a" if xla is None else f"{xla:.4g}"
    mfu = (f"{100 * r['mfu']:.1f}% of {r['peak_tflops_per_device']:g} TFLOP/s x "
           f"{r['devices']} ({r['peak_source']})" if r["mfu"] is not None
           else f"n/a (no peak known for {r['device_kind']!r}; pass --peak-tflops)")
    lines = [
        f"model:    {r['preset']} ({r['params']:,} parameters), objective {r['objective']}, "
        f"{r['dtype']}, scan_layers={r['scan_layers']}, remat={r['remat']}; "
        f"{r['devices']} x {r['device_kind']} ({r['platform']}), jax {r['jax']}",
        f"workload: batch {r['batch']} x {r['seq_len']} tokens, {r['predictions']} predictions "
        f"a sequence; {r['warmup']} warmup + {r['steps']} timed steps",
        f"compile:  {r['compile_s']:.1f} s",
        f"step:     {r['step_s']:.3f} s median (min {r['step_s_min']:.3f}, "
        f"max {r['step_s_max']:.3f}); {r['cores_busy']:.2f} cores busy, load average "
        f"{r['load_average_1m']:.2f}",
        f"tokens/s: {r['tokens_per_s']:,.0f}",
        f"flops:    {r['model_tflop_per_step']:.4g} TFLOP a step (model formula, the MFU basis); "
        f"XLA cost_analysis {xla} per device (counts a loop body once)",
        f"TFLOP/s:  {r['model_tflops_per_s']:.3g}",
        f"MFU:      {mfu}",
        f"memory:   {r['peak_memory_bytes'] / gib:.2f} GiB peak ({r['peak_memory_source']}); "
        f"process RSS high-water {r['process_peak_rss_bytes'] / gib:.2f} GiB",
    ]
    if "torch" in r:
        t = r["torch"]
        lines += [
            f"torch:    {t['step_s']:.3f} s median (min {t['step_s_min']:.3f}, "
            f"max {t['step_s_max']:.3f}), {t['cores_busy']:.2f} cores busy, "
            f"{t['tokens_per_s']:,.0f} tokens/s; transformers "
            f"{t['transformers']} BertForPreTraining ({t['attention']} attention), torch "
            f"{t['torch']}, {t['precision']}, on {t['device']} ({t['threads']} CPU threads)",
            f"ratio:    {r['speedup_vs_torch']:.2f}x (our tokens/s over torch's)",
        ]
    return "\n".join(lines)


@entry.command
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv if argv is None else argv)
    try:
        options, s = parse_args(argv)
        result = run(options, s)
    except UserError as e:
        report(str(e))
        return EXIT_BAD_INPUT
    described = finetune_epoch.describe if options.task == "finetune" else describe
    print(described(result), flush=True)
    if options.json:
        try:
            _write_report(options.json, result)
        except UserError as e:
            report(str(e))
            return EXIT_BAD_INPUT
    return 0


if __name__ == "__main__":
    sys.exit(main())
