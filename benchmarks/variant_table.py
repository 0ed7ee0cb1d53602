"""The BERT family on the packaged tasks: each variant's config pretrained at one size for one
budget, each Hugging Face checkpoint given, and random initialisation, all fine-tuned with one
recipe on sentiment, POS, NER and the pair task; one markdown table, its budget in its title.

    python benchmarks/variant_table.py [--variants bert,roberta,spanbert,electra,modernbert,
        albert,deberta,xlmr,mbert] [--hf NAME=DIR ...] [--steps 600] [--size tiny]
        [--batch-size 32] [--seq-len 128] [--learning-rate 2e-3] [--seed 0]
        [--tasks sentiment,pos,ner,pair] [--seeds 1] [--max-train-examples N]
        [--max-eval-examples N] [--epochs N] [--jobs 1] [--no-random-init] [--workdir DIR]

Pretraining: `python -m bertjax.main --config=configs/VARIANT.py` with the budget of
benchmarks/pretraining_objectives.py laid alike over every config (preset, steps, batch, one
sequence length, dropout 0, learning rate with 10% warmup, seed); each config keeps its objective,
masking, architecture and optimizer. The corpus is demo:wikipedia, prepared once per vocabulary
kind the configs ask for (`data.tokenizer_type` and `data.lowercase`: WordPiece uncased for most,
SentencePiece for ALBERT, cased for XLM-R and mBERT), each with a 4,096-entry vocabulary trained
on it. `--hf NAME=DIR` imports a checkpoint with `python -m bertjax.convert --from-hf DIR`.
Fine-tuning: benchmarks/budget_tasks.py's recipe through budget_pretraining.finetune for every
starting point; the score is the last epoch's on the task's test split. A starting point whose
pretraining or fine-tuning is refused gets a refusal line, not a score. Finished runs leave
result files under --workdir, so a rerun skips them.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import importlib
import json
import os
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import budget_pretraining  # noqa: E402
from budget_tasks import TASKS  # noqa: E402
import pretraining_objectives as runs  # noqa: E402
from pretraining_objectives import Objective  # noqa: E402
from bertjax.core import packaged  # noqa: E402
from bertjax.core.errors import UserError, exit_on_user_error  # noqa: E402

RANDOM = budget_pretraining.RANDOM
MLM = ("MLM", "eval_mlm_accuracy")
# pretraining_objectives' five, then the variants that differ by architecture or vocabulary.
VARIANTS = {
    **runs.OBJECTIVES,
    "albert": Objective("configs/albert.py", MLM, (("SOP", "eval_nsp_accuracy"),)),
    "deberta": Objective("configs/deberta.py", MLM),
    "xlmr": Objective("configs/xlmr.py", MLM),
    "mbert": Objective("configs/mbert.py", MLM, (("NSP", "eval_nsp_accuracy"),)),
}
TASK_ORDER = ("sentiment", "pos", "ner", "pair")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--hf", action="append", default=[], metavar="NAME=DIR",
                   help="a Hugging Face checkpoint on disk to import and fine-tune (repeatable)")
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--size", default="tiny", help="model.preset of every variant")
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--learning-rate", type=float, default=2e-3)
    p.add_argument("--eval-batches", type=int, default=16)
    p.add_argument("--seed", type=int, default=0, help="of pretraining")
    p.add_argument("--tasks", default=",".join(TASK_ORDER))
    p.add_argument("--seeds", type=int, default=1, help="fine-tuning seeds per cell")
    p.add_argument("--max-train-examples", type=int, default=0, help="per task (0: the recipe's)")
    p.add_argument("--max-eval-examples", type=int, default=0, help="per test split (0: all)")
    p.add_argument("--epochs", type=int, default=0, help="per task (0: the recipe's)")
    p.add_argument("--jobs", type=int, default=1, help="fine-tuning runs at a time")
    p.add_argument("--no-random-init", action="store_true")
    p.add_argument("--workdir", default=os.path.join(packaged.cache_dir(), "benchmarks",
                                                     "variant_table"))
    args = p.parse_args(argv)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    args.tasks = [t.strip() for t in args.tasks.split(",") if t.strip()]
    for name in args.variants:
        if name not in VARIANTS:
            raise UserError(f"unknown variant {name!r}; choose from {', '.join(VARIANTS)}")
    for task in args.tasks:
        if task not in TASKS:
            raise UserError(f"unknown task {task!r}; choose from {', '.join(TASKS)}")
    args.hf = dict(_hf_source(spec) for spec in args.hf)
    if min(args.steps, args.batch_size, args.seq_len, args.eval_batches, args.seeds,
           args.jobs) < 1 or min(args.max_train_examples, args.max_eval_examples,
                                 args.epochs) < 0:
        raise UserError("--steps, --batch-size, --seq-len, --eval-batches, --seeds and --jobs "
                        "must be positive; the caps and --epochs not negative")
    if not (args.variants or args.hf):
        raise UserError("nothing to compare: give --variants or --hf")
    return args


def _hf_source(spec: str) -> tuple[str, str]:
    name, sep, directory = spec.partition("=")
    if not (sep and name.strip() and directory):
        raise UserError(f"--hf takes NAME=DIR, got {spec!r}")
    if not os.path.isfile(os.path.join(directory, "config.json")):
        raise UserError(f"--hf {name}: {directory} holds no config.json (a save_pretrained "
                        "directory)")
    return name.strip(), os.path.abspath(directory)


def vocabulary_kind(objective: Objective) -> tuple[str, bool]:
    """(tokenizer kind, cased) the variant's config prepares its corpus with."""
    module = objective.config[:-len(".py")].replace("/", ".")
    data = importlib.import_module(module).get_config().data
    return data.tokenizer_type, not data.lowercase


def corpus_for(args, kind: tuple[str, bool]) -> str:
    tokenizer, cased = kind
    return runs.prepare_corpus(args.workdir, kind=tokenizer, cased=cased,
                               name=f"corpus-{tokenizer}-{'cased' if cased else 'uncased'}")


def pretrained_starts(args) -> dict:
    """{label: start} for each variant: its pretraining run's workdir, or its refusal."""
    starts = {}
    for name in args.variants:
        objective = VARIANTS[name]
        kind = vocabulary_kind(objective)
        label = f"{name} ({objective.config})"
        try:
            run = runs.pretrain(args, name, corpus_for(args, kind), objective)
        except UserError as e:
            starts[label] = {"refused": f"pretraining: {e}"}
            continue
        starts[label] = {"init": run["workdir"], "kind": kind, "wall_s": run["wall_s"],
                         "mlm": run["eval"].get(objective.mlm[1])}
    return starts


def imported_starts(args) -> dict:
    """{label: start} for each --hf checkpoint, converted once under --workdir."""
    starts = {}
    for name, directory in args.hf.items():
        output = os.path.join(args.workdir, f"hf-{name}-{runs.key(directory)}")
        label = f"{name} (Hugging Face import)"
        if not os.path.isdir(output):
            done = subprocess.run([sys.executable, "-m", "bertjax.convert", "--from-hf",
                                   directory, "--output", output], cwd=runs.REPO,
                                  capture_output=True, text=True)
            if done.returncode:
                starts[label] = {"refused": "import: " + _last_line(done.stderr)}
                continue
        starts[label] = {"init": output, "imported": directory}
    return starts


def _last_line(text: str, limit: int = 160) -> str:
    """The refusal's own words: the last line, from `bertjax: error:` on, cut at LIMIT."""
    lines = [line for line in text.strip().splitlines() if line.strip()]
    line = lines[-1].split("bertjax: error: ")[-1] if lines else "no message"
    return line if len(line) <= limit else line[:limit] + "…"


def finetune_all(args, starts: dict, prepared: str) -> dict:
    """{label: {task: [scores] or refusal text}}: every start on every task and seed."""
    results = {label: {} for label in starts}
    jobs = [(label, task, seed) for label, start in starts.items() if "refused" not in start
            for task in args.tasks for seed in range(args.seeds)]

    def one(label, task, seed):
        try:
            score = budget_pretraining.finetune(args, task, label, starts[label].get("init", ""),
                                                prepared, seed)["score"]
        except UserError as e:
            return label, task, _last_line(str(e))
        return label, task, float(score)

    with concurrent.futures.ThreadPoolExecutor(args.jobs) as pool:
        for label, task, outcome in pool.map(lambda job: one(*job), jobs):
            cell = results[label]
            if isinstance(outcome, str):
                cell[task] = outcome
            elif not isinstance(cell.get(task), str):
                cell.setdefault(task, []).append(outcome)
    return results


def title(args) -> str:
    caps = (f"{args.max_train_examples or 'the recipe’s'} training examples, "
            f"{args.max_eval_examples or 'all'} test examples, "
            f"{args.epochs or 'the recipe’s'} epochs")
    return (f"Pretraining: {args.size}, {args.steps} steps of {args.batch_size} x {args.seq_len} "
            f"tokens, lr {args.learning_rate:g}, seed {args.seed}. Fine-tuning: "
            f"benchmarks/budget_tasks.py's recipe, {caps}, {args.seeds} seed(s) per cell; "
            "test-split scores in %.")


def table(args, starts: dict, results: dict) -> str:
    tasks = [t for t in TASK_ORDER if t in args.tasks]
    lines = [title(args), "", "| starting point | pretraining | held-out MLM | " + " | ".join(
        f"{t} ({TASKS[t].metric})" for t in tasks) + " |", "|---|---|---|" + "---|" * len(tasks)]
    refusals = []
    for label, start in starts.items():
        if "refused" in start:
            refusals.append(f"{label}: refused ({start['refused']})")
            cells = ["refused"] * (len(tasks) + 2)
        else:
            cells = [_pretraining_cell(args, start),
                     "—" if start.get("mlm") is None else f"{100 * start['mlm']:.1f}"]
            for t in tasks:
                outcome = results[label].get(t)
                if isinstance(outcome, str):
                    refusals.append(f"{label}, {t}: refused ({outcome})")
                    cells.append("refused")
                else:
                    cells.append(budget_pretraining.spread(outcome or []))
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return "\n".join(lines + ([""] + refusals if refusals else []))


def _pretraining_cell(args, start: dict) -> str:
    if "wall_s" in start:
        tokenizer, cased = start["kind"]
        return (f"{args.steps} steps, {start['wall_s'] / 60:.1f} min; {tokenizer}"
                f"{' cased' if cased else ''}")
    if "imported" in start:
        return f"imported from {os.path.basename(start['imported'])}"
    return "none"


@exit_on_user_error
def main(argv=None) -> None:
    args = parse_args(argv)
    os.makedirs(args.workdir, exist_ok=True)
    prepared = corpus_for(args, ("wordpiece", False))  # random init's vocabulary
    args.pairs = budget_pretraining.pair_files(args.workdir) if "pair" in args.tasks else ""
    # Random init before the imports: a large imported model's runs come last.
    starts = {**pretrained_starts(args), **({} if args.no_random_init else {RANDOM: {}}),
              **imported_starts(args)}
    results = finetune_all(args, starts, prepared)
    text = table(args, starts, results)
    with open(os.path.join(args.workdir, "variant_table.json"), "w") as f:
        json.dump({"starts": starts, "results": results}, f, indent=1)
    with open(os.path.join(args.workdir, "variant_table.md"), "w") as f:
        f.write(text + "\n")
    print("\n" + text)


if __name__ == "__main__":
    main()
