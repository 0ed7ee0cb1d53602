"""Does pretraining with bertjax pay? configs/budget.py pretrained for --minutes of wall time, its
checkpoints along the way, the same model pretrained for the same wall time by Hugging Face
transformers, and random initialisation, each fine-tuned alike on the same downstream tasks with
several seeds; a bag-of-words baseline where the task allows. One table, one PNG.

    python benchmarks/budget_pretraining.py --minutes 60 [--points 0.25,0.5,1] [--seeds 3]
        [--tasks sentiment,ner,pair,pos] [--size mini] [--jobs 2] [--data-workers N]
        [--workdir DIR]

Pretraining: `python -m bertjax.main --config=configs/budget.py` on the books+wiki corpus
(prepared once, `WORKDIR/corpus`), checkpointing every `min(points) x minutes`; the peer is
benchmarks/transformers_budget.py (torch BertForMaskedLM, AdamW, the same batches, masking, batch,
learning rate and schedule over the same budget), whose checkpoints are imported with
`python -m bertjax.convert --from-hf`. Each pretraining run has the machine to itself. Held-out
MLM accuracy: bertjax's at its evaluation nearest before each point (same held-out documents),
the peer's on the same held-out batches. Fine-tuning: the same bertjax job and recipe for every
starting point; the score is the last epoch's on the task's test split (no checkpoint picked on
it), mean and spread over seeds. Finished runs leave result files under --workdir, so a rerun
skips them.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import json
import os
import statistics
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import budget_baselines  # noqa: E402
from budget_tasks import TASKS  # noqa: E402
import pretraining_objectives as runs  # noqa: E402
from bertjax.core import packaged  # noqa: E402
from bertjax.core.errors import UserError, exit_on_user_error  # noqa: E402

REPO = runs.REPO
RANDOM = "random init"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=60.0, help="the pretraining budget")
    p.add_argument("--points", default="0.25,0.5,1",
                   help="fractions of the budget fine-tuned from (multiples of the smallest)")
    p.add_argument("--seeds", type=int, default=3)
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--size", default="mini", help="model.preset of both frameworks' model")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--jobs", type=int, default=2, help="fine-tuning runs at a time")
    p.add_argument("--max-train-examples", type=int, default=0,
                   help="per task (0: all); a quick run's knob")
    p.add_argument("--max-eval-examples", type=int, default=0,
                   help="of each test split (0: all); a quick run's knob")
    p.add_argument("--epochs", type=int, default=0, help="per task (0: the task's own)")
    p.add_argument("--finetune-points", default="",
                   help="the --points fine-tuned from (default: all); the checkpoints stay")
    p.add_argument("--peer-points", default="1",
                   help="the fractions at which transformers' run is fine-tuned from")
    p.add_argument("--no-transformers", action="store_true")
    p.add_argument("--data-workers", type=int, default=-1,
                   help="background batch builders of both pretraining runs (-1: the config's "
                        "data.workers); 0 for a quick run, whose builders' start-up is most of it")
    p.add_argument("--prepared", default="",
                   help="a prepared corpus to use (default: demo:books+wiki, prepared once)")
    p.add_argument("--workdir", default=os.path.join(packaged.cache_dir(), "benchmarks",
                                                     "budget_pretraining"))
    args = p.parse_args(argv)
    try:
        args.points = sorted(float(x) for x in args.points.split(","))
        args.peer_points = sorted(float(x) for x in args.peer_points.split(","))
        args.finetune_points = sorted(float(x) for x in args.finetune_points.split(",")
                                      if x.strip())
    except ValueError:
        raise UserError("--points and --peer-points take fractions like 0.25,0.5,1") from None
    args.tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    unknown = [t for t in args.tasks if t not in TASKS]
    if unknown:
        raise UserError(f"unknown task {unknown[0]!r}; choose from {', '.join(TASKS)}")
    data_workers_setting(args.data_workers)  # refused here, before anything is written
    if not (args.minutes > 0 and args.seeds > 0 and args.jobs > 0 and args.points):
        raise UserError("--minutes, --seeds, --jobs and --points must be positive")
    if not all(0 < f <= 1 for f in args.points + args.peer_points):
        raise UserError("--points and --peer-points are fractions in (0, 1]")
    if not set(args.finetune_points) <= set(args.points):
        raise UserError("--finetune-points must be among --points")
    step = args.points[0]
    if args.points[-1] != 1 or any(abs(f / step - round(f / step)) > 1e-6 for f in args.points):
        raise UserError("--points must end at 1 and be multiples of the smallest")
    return args


def data_workers_setting(count: int) -> dict:
    """The pretraining runs' `data.workers` for --data-workers COUNT (none for -1: the
    config's own)."""
    if count < -1:
        raise UserError("--data-workers takes a count, or -1 for the config's")
    return {} if count == -1 else {"data.workers": count}


def recipe(args, prepared: str) -> dict:
    """configs/budget.py's settings the benchmark sets for both frameworks."""
    return {"data.prepared": prepared, "model.preset": args.size,
            "train.batch_size": args.batch_size, "train.time_budget_minutes": args.minutes,
            "train.checkpoint_every_minutes": args.minutes * args.points[0],
            "train.eval_every": 200, **data_workers_setting(args.data_workers)}


def point_label(framework: str, fraction: float, minutes: float) -> str:
    return f"{framework} {fraction * minutes:g} min"


def pretrain_bertjax(args, prepared: str) -> dict:
    """{label: (params export, held-out record, minutes)} for each point."""
    overrides = recipe(args, prepared)
    workdir = os.path.join(args.workdir, "bertjax-" + runs.key(
        {k: v for k, v in overrides.items() if k != "data.prepared"}))
    timing = runs.cached(workdir + ".json", lambda: runs.run_job("configs/budget.py", workdir,
                                                                 overrides))
    records = [json.loads(line) for line in open(os.path.join(workdir, "metrics.jsonl"))]
    logged = [(r["step"], r["budget_spent_s"]) for r in records if "budget_spent_s" in r]
    evals = [r for r in records if "eval_mlm_accuracy" in r]
    steps = sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints")) if d.isdigit())
    points = {}
    for fraction in args.finetune_points or args.points:
        index = len(steps) - 1 if fraction == 1 else round(fraction / args.points[0]) - 1
        step = steps[min(index, len(steps) - 1)]
        export = os.path.join(workdir + "-exports", f"step{step}")
        if not os.path.isdir(export):
            subprocess.run([sys.executable, "-m", "bertjax.export", "--workdir", workdir,
                            "--format", "params", "--step", str(step), "--output", export],
                           cwd=REPO, check=True, capture_output=True)
        # A checkpoint every so many minutes falls between logged steps and evaluations: the
        # nearest of each stands for it (the table names the evaluation's step).
        _, seconds = min(logged, key=lambda r: abs(r[0] - step), default=(step, 0.0))
        nearest = min(evals, key=lambda r: abs(r["step"] - step), default=None)
        points[point_label("bertjax", fraction, args.minutes)] = {
            "init": export, "step": step, "minutes": seconds / 60,
            "mlm": nearest and nearest["eval_mlm_accuracy"],
            "mlm_step": nearest and nearest["step"]}
    print(f"bertjax pretraining: {timing['wall_s']:.0f} s wall, {steps[-1]} steps",
          file=sys.stderr)
    return points


def pretrain_transformers(args, prepared: str) -> dict:
    overrides = recipe(args, prepared)
    out = os.path.join(args.workdir, "transformers-" + runs.key(
        {k: v for k, v in overrides.items() if k != "data.prepared"}, args.peer_points))
    command = [sys.executable, os.path.join(HERE, "transformers_budget.py"), "--prepared",
               prepared, "--minutes", str(args.minutes), "--preset", args.size,
               "--batch-size", str(args.batch_size), "--config", "configs/budget.py",
               "--save-at", ",".join(f"{f:g}" for f in args.peer_points), "--output-dir", out,
               "--data-workers", str(args.data_workers)]

    def compute():
        subprocess.run(command, cwd=REPO, check=True, env={**os.environ, "PYTHONPATH": REPO})
        with open(os.path.join(out, "summary.json")) as f:
            return json.load(f)

    summary = runs.cached(out + ".json", compute)
    points = {}
    for saved in summary["points"]:
        converted = saved["path"] + "-bertjax"
        if not os.path.isdir(converted):
            subprocess.run([sys.executable, "-m", "bertjax.convert", "--from-hf", saved["path"],
                            "--output", converted], cwd=REPO, check=True, capture_output=True)
        points[point_label("transformers", saved["fraction"], args.minutes)] = {
            "init": converted, "step": saved["step"], "minutes": saved["progress"] * args.minutes,
            "mlm": saved.get("eval_mlm_accuracy")}
    return points


def finetune(args, task_name: str, start: str, init: str, prepared: str, seed: int) -> dict:
    task = TASKS[task_name]
    train, test = task.files(args.pairs)
    overrides = {**dict(task.overrides), "train.seed": seed, "data.train": train,
                 "data.eval": test}
    if args.max_train_examples:
        overrides["data.max_train_examples"] = args.max_train_examples
    if args.max_eval_examples:
        overrides["data.max_eval_examples"] = args.max_eval_examples
    if args.epochs:
        overrides["train.epochs"] = args.epochs
    if init:
        overrides["init_checkpoint"] = init
    else:  # the same encoder shape and vocabulary, nothing loaded
        overrides.update({"model.preset": args.size,
                          "data.tokenizer": os.path.join(prepared, "tokenizer")})
    workdir = os.path.join(args.workdir, f"{task_name}-" + runs.key(
        start, init, {k: v for k, v in overrides.items() if k != "data.tokenizer"}))

    def compute():
        timing = runs.run_job(task.config, workdir, overrides)
        with open(os.path.join(workdir, "results.json")) as f:
            results = json.load(f)
        return {**timing, "score": results["history"][-1][task.metric]}

    return runs.cached(workdir + ".json", compute)


def pair_files(workdir: str) -> str:
    """The Wikipedia sentence-passage pair files (written once)."""
    folder = os.path.join(workdir, "wiki_pairs")
    if not os.path.isdir(folder):
        subprocess.run([sys.executable, "-m", "bertjax.retrieval.wiki_pairs", "--output",
                        folder], cwd=REPO, check=True, capture_output=True)
    return folder


def spread(scores: list[float]) -> str:
    if not scores:
        return "—"
    mean = 100 * statistics.fmean(scores)
    return f"{mean:.1f}" + (f" ± {100 * statistics.stdev(scores):.1f}" if len(scores) > 1 else "")


def table(args, starts: dict, scores: dict, baselines: dict) -> str:
    lines = ["| starting point | pretraining | held-out MLM accuracy | " + " | ".join(
        f"{t} ({TASKS[t].metric}, test)" for t in args.tasks) + " |",
        "|---|---|---|" + "---|" * len(args.tasks)]
    for start, point in starts.items():
        pre = "—" if point is None else f"{point['minutes']:.1f} min, {point['step']} steps"
        mlm = "—" if point is None or point["mlm"] is None else f"{100 * point['mlm']:.1f}%"
        if point is not None and point.get("mlm_step") not in (None, point["step"]):
            mlm += f" (step {point['mlm_step']})"
        cells = [spread(scores[start][t]) for t in args.tasks]
        lines.append(f"| {start} | {pre} | {mlm} | " + " | ".join(cells) + " |")
    for name, by_task in baselines.items():
        cells = [spread([by_task[t]]) if t in by_task else "—" for t in args.tasks]
        lines.append(f"| {name} | — | — | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def goals(args, scores: dict) -> list[str]:
    """The issue's three goals, each stated as met or not with its figures."""
    mean = lambda start, t: statistics.fmean(scores[start][t])  # noqa: E731
    full = point_label("bertjax", 1, args.minutes)
    half = [point_label("bertjax", f, args.minutes)
            for f in args.finetune_points or args.points if f <= 0.5]
    peer = point_label("transformers", 1, args.minutes)
    lines = []
    for t in args.tasks:
        gain = 100 * (mean(full, t) - mean(RANDOM, t))
        lines.append(f"{t}: bertjax {args.minutes:g} min beats random init by {gain:+.1f} points"
                     + (f" (goal >= 10: {'met' if gain >= 10 else 'not met'})"
                        if t == "sentiment" else ""))
        if peer in scores:
            lines.append(f"{t}: at equal wall time bertjax {100 * mean(full, t):.1f} vs "
                         f"transformers {100 * mean(peer, t):.1f} "
                         f"({'met' if mean(full, t) >= mean(peer, t) else 'not met'})")
            if half:
                best = max(half, key=lambda s: mean(s, t))
                lines.append(f"{t}: in half the time bertjax ({best}) {100 * mean(best, t):.1f}"
                             f" vs transformers' {args.minutes:g}-minute {100 * mean(peer, t):.1f}"
                             f" ({'met' if mean(best, t) >= mean(peer, t) else 'not met'})")
    return lines


def workdir_and_corpus(args) -> str:
    """Creates the benchmark's workdir; the prepared corpus: --prepared, else books+wiki with
    configs/budget.py's 8,192-token vocabulary, prepared there once."""
    os.makedirs(args.workdir, exist_ok=True)
    return args.prepared or runs.prepare_corpus(args.workdir, "demo:books+wiki", vocab_size=8192)


@exit_on_user_error
def main(argv=None) -> None:
    args = parse_args(argv)
    prepared = workdir_and_corpus(args)
    # Written before any thread could race to write it.
    args.pairs = pair_files(args.workdir) if "pair" in args.tasks else ""
    starts = {RANDOM: None, **pretrain_bertjax(args, prepared)}
    if not args.no_transformers:
        starts.update(pretrain_transformers(args, prepared))
    jobs = [(t, start, point["init"] if point else "", seed) for start, point in starts.items()
            for t in args.tasks for seed in range(args.seeds)]
    scores = {start: {t: [] for t in args.tasks} for start in starts}
    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        futures = {pool.submit(finetune, args, t, start, init, prepared, seed): (start, t)
                   for t, start, init, seed in jobs}
        for future in concurrent.futures.as_completed(futures):
            start, t = futures[future]
            scores[start][t].append(future.result()["score"])
    # Computed once per set of tasks: a rerun reads them, as it reads every fine-tuning result.
    tasks = {t: (TASKS[t].kind, TASKS[t].metric, *TASKS[t].files(args.pairs)) for t in args.tasks}
    baselines = runs.cached(os.path.join(args.workdir, f"baselines-{runs.key(tasks)}.json"),
                            lambda: budget_baselines.run(tasks))
    plot = os.path.join(args.workdir, "budget_pretraining.png")
    budget_baselines.plot(plot, args, starts, scores, baselines)
    print(f"\n{args.size}, {args.minutes:g} minutes, batch {args.batch_size}, {args.seeds} seeds; "
          f"curve: {plot}\n")
    print(table(args, starts, scores, baselines))
    print("\n" + "\n".join(goals(args, scores)))


if __name__ == "__main__":
    main()
