"""Pretraining objectives on one budget: BERT (MLM + NSP), RoBERTa (MLM, full sentences), SpanBERT
(span masking + SBO), ELECTRA (replaced-token detection) and ModernBERT (its architecture, 30%
masking, full sentences) pretrained on the demo Wikipedia
corpus with the same model size, steps, batch, sequence length, learning rate and seed, each then
fine-tuned on the packaged movie reviews (dev accuracy) and tweet NER (dev entity F1), next to the
same model fine-tuned from random initialisation: one markdown table.

    python benchmarks/pretraining_objectives.py [--objectives bert,roberta,spanbert,electra,modernbert]
        [--steps 600] [--size tiny] [--batch-size 32] [--seq-len 128] [--learning-rate 2e-3]
        [--sentiment-examples 3000] [--sentiment-epochs 2] [--sentiment-lr 3e-4]
        [--ner-epochs 6] [--ner-lr 1e-3] [--seed 0]
        [--no-random-init] [--workdir DIR]

Every run is the real job, `python -m bertjax.main --config=configs/OBJECTIVE.py`, one process
each, on one corpus prepared once (`WORKDIR/corpus`, 4,096-token WordPiece). Each objective's
config keeps what makes it that objective (the objective, its masking, its Adam beta2) and the
budget is overridden alike for all: preset, steps, batch, one sequence length, dropout 0, learning
rate with 10% warmup, bias correction, seed. The held-out figures are the runs' own evaluation at
the last step (`eval_*` in metrics.jsonl) on the same held-out articles (5% of the documents),
each built the objective's way: SpanBERT's masked tokens are whole spans, harder to guess than
BERT's scattered ones, and ELECTRA's MLM figure is its small generator's. Pretraining wall time
includes start-up, compilation and the evaluation. Fine-tuning reports the best epoch's dev score
(what the job keeps; chosen on dev, so optimistic for every row alike).

Each finished run leaves a result file under --workdir named after its settings, so a rerun
skips it; an interrupted job resumes from its checkpoint.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import math
import os
import resource
import subprocess
import sys
import time

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bertjax.core import packaged  # noqa: E402
from bertjax.core.errors import UserError, exit_on_user_error  # noqa: E402


@dataclasses.dataclass(frozen=True)
class Objective:
    config: str
    # (label, metrics.jsonl key) of the held-out figures: the MLM column, then the objective's
    # own (NSP, SBO, RTD) in the next one.
    mlm: tuple[str, str]
    own: tuple[tuple[str, str], ...] = ()
    mask_prob: float = 0.15  # the prediction budget follows it, so the rate is not clipped
    sliding_window: int = 0  # its window, narrowed to --seq-len when that is shorter


OBJECTIVES = {
    "bert": Objective("configs/base.py", ("MLM", "eval_mlm_accuracy"),
                      (("NSP", "eval_nsp_accuracy"),)),
    "roberta": Objective("configs/roberta.py", ("MLM", "eval_mlm_accuracy")),
    "spanbert": Objective("configs/spanbert.py", ("MLM (spans)", "eval_mlm_accuracy"),
                          (("SBO", "eval_sbo_accuracy"),)),
    # The discriminator is the encoder that is fine-tuned: model.preset sizes it. Guessing
    # "original" for every token scores 1 - the replaced fraction, so that is shown too.
    "electra": Objective("configs/electra.py", ("generator MLM", "eval_mlm_accuracy"),
                         (("RTD", "eval_rtd_accuracy"), ("replaced", "eval_replaced_fraction"))),
    # ModernBERT's architecture and recipe (rotary, pre-norm, GeGLU, sliding windows, 30%
    # masking, RoBERTa's full sentences) at the same size class; its optimizer stays its own.
    "modernbert": Objective("configs/modernbert.py", ("MLM (30%)", "eval_mlm_accuracy"),
                            mask_prob=0.3, sliding_window=128),
}
TASKS = {  # name: (config, metric shown)
    "sentiment": ("configs/finetune_sentiment.py", "accuracy"),
    "ner": ("configs/finetune_ner.py", "entity_f1"),
}
RANDOM = "random init"
VOCAB_SIZE = 4096


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--objectives", default="",
                   help="comma-separated; default: every one whose config this checkout has")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--size", default="tiny", help="model.preset: tiny | mini | small | ...")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--learning-rate", type=float, default=2e-3)
    p.add_argument("--eval-batches", type=int, default=16)
    p.add_argument("--sentiment-examples", type=int, default=3000,
                   help="training sentences for sentiment (0: all 8,484)")
    p.add_argument("--sentiment-epochs", type=int, default=2)
    # A tiny model fine-tuned for a few hundred steps wants a rate well above BERT's 3e-5: from
    # the 600-step BERT, 2 epochs of 3,000 sentences reach 54.7% dev accuracy at 1e-4, 61.3% at
    # 3e-4, 60.7% at 1e-3.
    p.add_argument("--sentiment-lr", type=float, default=3e-4)
    p.add_argument("--ner-epochs", type=int, default=6)
    p.add_argument("--ner-lr", type=float, default=1e-3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-random-init", action="store_true",
                   help="leave out the fine-tuning runs from random initialisation")
    p.add_argument("--workdir", default=os.path.join(packaged.cache_dir(), "benchmarks",
                                                     "pretraining_objectives"))
    args = p.parse_args(argv)
    args.objectives = ([o.strip() for o in args.objectives.split(",") if o.strip()]
                       or [n for n, o in OBJECTIVES.items() if _has_config(o)])
    for name in args.objectives:
        if name not in OBJECTIVES:
            raise UserError(f"unknown objective {name!r}; choose from {', '.join(OBJECTIVES)}")
        if not _has_config(OBJECTIVES[name]):
            raise UserError(f"objective {name} needs {OBJECTIVES[name].config}, which this "
                            "checkout does not have")
    if min(args.steps, args.batch_size, args.seq_len, args.sentiment_epochs,
           args.ner_epochs) < 1 or args.sentiment_examples < 0 or args.eval_batches < 1:
        raise UserError("--steps, --batch-size, --seq-len, --eval-batches and the epochs must be "
                        "positive")
    return args


def _has_config(objective: Objective) -> bool:
    return os.path.isfile(os.path.join(REPO, objective.config))


def pretrain_overrides(args, prepared: str, objective: Objective | None = None) -> dict:
    """The budget every objective gets alike (the prediction slots follow its masking rate)."""
    objective = objective or OBJECTIVES["bert"]
    predictions = math.ceil(args.seq_len * objective.mask_prob)  # 20 at 128 tokens and 15%
    window = {"model.sliding_window": min(objective.sliding_window, args.seq_len // 2 * 2)
              } if objective.sliding_window else {}
    return {**window,
        "data.prepared": prepared, "data.eval_fraction": 0.05,
        "model.preset": args.size, "model.hidden_dropout": 0.0, "model.attention_dropout": 0.0,
        "schedule.short_seq_len": args.seq_len, "schedule.long_seq_len": args.seq_len,
        "schedule.short_max_predictions": predictions,
        "schedule.long_max_predictions": predictions, "schedule.long_fraction": 0.0,
        "train.steps": args.steps, "train.batch_size": args.batch_size, "train.seed": args.seed,
        "train.log_every": max(1, args.steps // 10), "train.checkpoint_every": args.steps,
        "train.keep_checkpoints": 1, "train.eval_every": args.steps,
        "train.eval_batches": args.eval_batches,
        "optimizer.learning_rate": args.learning_rate,
        "optimizer.warmup_steps": max(1, args.steps // 10),
        "optimizer.bias_correction": True,
    }


def finetune_overrides(args, task: str, start: str, prepared: str) -> dict:
    learning_rate = args.sentiment_lr if task == "sentiment" else args.ner_lr
    overrides = {"optimizer.learning_rate": learning_rate, "train.seed": args.seed}
    if task == "sentiment":
        overrides.update({"data.max_train_examples": args.sentiment_examples,
                          "train.epochs": args.sentiment_epochs})
    else:
        overrides["train.epochs"] = args.ner_epochs
    if start == RANDOM:  # the same encoder shape and vocabulary, nothing loaded
        overrides.update({"model.preset": args.size,
                          "data.tokenizer": os.path.join(prepared, "tokenizer")})
    return overrides


def key(*parts) -> str:
    """A short name for everything that decides a run's result."""
    return hashlib.sha1(json.dumps(parts, sort_keys=True).encode()).hexdigest()[:10]


def run_job(config: str, workdir: str, overrides: dict) -> dict:
    """Runs one bertjax job to the end; its wall and CPU seconds."""
    command = [sys.executable, "-m", "bertjax.main", f"--config={config}",
               f"--workdir={workdir}"] + [f"--config.{k}={v}" for k, v in overrides.items()]
    print(f"$ {' '.join(command[1:])}", file=sys.stderr, flush=True)
    started, cpu = time.perf_counter(), _children_cpu()
    done = subprocess.run(command, cwd=REPO, env={**os.environ, "PYTHONPATH": REPO},
                          stderr=subprocess.PIPE, text=True)
    if done.returncode:
        raise UserError(f"{config} on {workdir} failed (exit {done.returncode}): "
                        f"{done.stderr.strip()[-2000:]}")
    return {"wall_s": time.perf_counter() - started, "cpu_s": _children_cpu() - cpu}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def cached(path: str, compute) -> dict:
    if os.path.isfile(path):
        with open(path) as f:
            return json.load(f)
    result = compute()
    with open(path + ".tmp", "w") as f:
        json.dump(result, f, indent=1)
    os.replace(path + ".tmp", path)
    return result


def prepare_corpus(workdir: str, corpus: str = "demo:wikipedia", vocab_size: int = VOCAB_SIZE,
                   kind: str = "wordpiece", cased: bool = False, name: str = "corpus") -> str:
    """WORKDIR/NAME: CORPUS prepared once with a KIND vocabulary trained on it."""
    output = os.path.join(workdir, name)
    if not os.path.isfile(os.path.join(output, "manifest.json")):
        subprocess.run([sys.executable, "-m", "bertjax.data.prepare", "--input", corpus,
                        "--output", output, "--train-vocab", kind, "--vocab-size",
                        str(vocab_size), "--no-progress"] + (["--cased"] if cased else []),
                       cwd=REPO, env={**os.environ, "PYTHONPATH": REPO}, check=True)
    return output


def last_eval(workdir: str) -> dict:
    """The last record of metrics.jsonl that holds held-out (eval_*) figures."""
    found = {}
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        for line in f:
            record = json.loads(line)
            if any(k.startswith("eval_") for k in record):
                found = record
    return found


def pretrain(args, name: str, prepared: str, objective: Objective | None = None) -> dict:
    """The run of OBJECTIVES[name] (or OBJECTIVE under that name) on the shared budget."""
    objective = objective or OBJECTIVES[name]
    overrides = pretrain_overrides(args, prepared, objective)
    run_key = key(name, objective.config, {k: v for k, v in overrides.items()
                                           if k != "data.prepared"})
    workdir = os.path.join(args.workdir, f"pretrain-{name}-{run_key}")

    def compute():
        timing = run_job(objective.config, workdir, overrides)
        return {**timing, "workdir": workdir, "eval": last_eval(workdir)}

    result = cached(workdir + ".json", compute)
    missing = [k for _, k in (objective.mlm, *objective.own) if k not in result["eval"]]
    if missing:
        print(f"warning: {name}: no {', '.join(missing)} in the held-out record; it has "
              f"{', '.join(sorted(result['eval']))}", file=sys.stderr)
    return result


def finetune(args, task: str, start: str, init: str, prepared: str) -> dict:
    config, metric = TASKS[task]
    overrides = finetune_overrides(args, task, start, prepared)
    if init:
        overrides["init_checkpoint"] = init
    run_key = key(task, start, {k: v for k, v in overrides.items()
                                if k not in ("init_checkpoint", "data.tokenizer")},
                  os.path.basename(init))
    workdir = os.path.join(args.workdir, f"{task}-{start.replace(' ', '_')}-{run_key}")

    def compute():
        timing = run_job(config, workdir, overrides)
        with open(os.path.join(workdir, "results.json")) as f:
            results = json.load(f)
        return {**timing, "metric": metric, "best": results["eval"][metric],
                "final": results["history"][-1][metric], "steps": results["steps"]}

    return cached(workdir + ".json", compute)


def percent(value) -> str:
    return "—" if value is None else f"{100 * value:.1f}%"


def held_out(entries, record: dict) -> str:
    return ", ".join(f"{label} {percent(record.get(key))}" for label, key in entries) or "—"


def table(rows: list[dict]) -> str:
    """One markdown table; a row is {start, pretrain (or None), sentiment, ner}."""
    lines = ["| starting point | pretraining wall (CPU) | held-out MLM | held-out own objective "
             "| sentiment dev accuracy | tweet NER dev entity F1 |",
             "|---|---|---|---|---|---|"]
    for row in rows:
        pre = row.get("pretrain")
        if pre is None:
            cells = ["—", "—", "—"]
        else:
            objective = OBJECTIVES[row["start"]]
            cells = [f"{pre['wall_s']:.0f} s ({pre['cpu_s']:.0f} s)",
                     held_out([objective.mlm], pre["eval"]), held_out(objective.own, pre["eval"])]
        scores = [percent(row[task]["best"]) if row.get(task) else "—" for task in TASKS]
        lines.append(f"| {row['start']} | " + " | ".join(cells + scores) + " |")
    return "\n".join(lines)


@exit_on_user_error
def main(argv=None) -> None:
    args = parse_args(argv)
    os.makedirs(args.workdir, exist_ok=True)
    prepared = prepare_corpus(args.workdir)
    rows = []
    starts = list(args.objectives) + ([] if args.no_random_init else [RANDOM])
    for start in starts:
        row = {"start": start}
        if start != RANDOM:
            row["pretrain"] = pretrain(args, start, prepared)
        init = row["pretrain"]["workdir"] if start != RANDOM else ""
        for task in TASKS:
            row[task] = finetune(args, task, start, init, prepared)
        rows.append(row)
        print(table([row]).splitlines()[-1], flush=True)
    print(f"\n{args.size}, {args.steps} steps of {args.batch_size} x {args.seq_len} tokens, lr "
          f"{args.learning_rate:g}, seed {args.seed}; sentiment: "
          f"{args.sentiment_examples or 'all'} sentences, {args.sentiment_epochs} epochs, lr "
          f"{args.sentiment_lr:g}; NER: {args.ner_epochs} epochs, lr {args.ner_lr:g}\n")
    print(table(rows))


if __name__ == "__main__":
    main()
