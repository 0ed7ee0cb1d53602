"""The choices behind configs/budget.py, measured: each variant changes one setting of the recipe,
is pretrained for the same wall-clock budget on the books+wiki corpus, and is fine-tuned on the
packaged movie-review sentiment (all 8,484 training sentences, 2 epochs, lr 3e-4: the last
epoch's test accuracy); one markdown table.

    python benchmarks/budget_recipe.py [--minutes 5] [--variants recipe,tiny,small,...]
        [--seeds 1] [--data-workers N] [--workdir DIR]

Held-out MLM accuracy is each run's own (a 30%-masked run guesses more tokens, with less
context, than a 15% one: compare it within a masking rate); the sentiment score is the verdict.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
sys.path.insert(0, HERE)

import budget_pretraining as budget  # noqa: E402
import pretraining_objectives as runs  # noqa: E402
from bertjax.core import packaged  # noqa: E402
from bertjax.core.errors import UserError, exit_on_user_error  # noqa: E402

# name: the settings it changes from configs/budget.py (mini, 30% masking, 128 tokens, batch 32,
# peak 1e-3 after 10% of the budget).
VARIANTS = {
    "recipe": {},
    "tiny": {"model.preset": "tiny"},
    "small": {"model.preset": "small"},
    "mask 15%": {"masking.mask_prob": 0.15, "schedule.short_max_predictions": 20},
    "64 tokens": {"schedule.short_seq_len": 64, "schedule.short_max_predictions": 20},
    "batch 64": {"train.batch_size": 64},
    "lr 2e-3": {"optimizer.learning_rate": 2e-3},
    "lr 5e-4": {"optimizer.learning_rate": 5e-4},
    "NSP (bert)": {"objective": "bert"},
}


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--minutes", type=float, default=5.0)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--seeds", type=int, default=1)
    p.add_argument("--prepared", default="",
                   help="a prepared corpus to use (default: demo:books+wiki, prepared once)")
    p.add_argument("--max-train-examples", type=int, default=0, help="a quick run's knob")
    p.add_argument("--max-eval-examples", type=int, default=0, help="a quick run's knob")
    p.add_argument("--epochs", type=int, default=0, help="0: the task's own (2)")
    p.add_argument("--data-workers", type=int, default=-1,
                   help="background batch builders of each pretraining run (-1: the config's)")
    p.add_argument("--workdir", default=os.path.join(packaged.cache_dir(), "benchmarks",
                                                     "budget_recipe"))
    args = p.parse_args(argv)
    args.variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    for name in args.variants:
        if name not in VARIANTS:
            raise UserError(f"unknown variant {name!r}; choose from {', '.join(VARIANTS)}")
    if not (args.minutes > 0 and args.seeds > 0):
        raise UserError("--minutes and --seeds must be positive")
    budget.data_workers_setting(args.data_workers)  # refused here, before anything is written
    return args


def pretrain(args, name: str, prepared: str) -> dict:
    overrides = {"data.prepared": prepared, "train.time_budget_minutes": args.minutes,
                 "train.checkpoint_every_minutes": 0, "train.eval_every": 1_000_000,
                 "train.plot": False, **VARIANTS[name],
                 **budget.data_workers_setting(args.data_workers)}
    workdir = os.path.join(args.workdir, "pretrain-" + runs.key(
        {k: v for k, v in overrides.items() if k != "data.prepared"}))

    def compute():
        timing = runs.run_job("configs/budget.py", workdir, overrides)
        return {**timing, "workdir": workdir, "eval": runs.last_eval(workdir),
                "steps": max(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints"))
                             if d.isdigit())}

    return runs.cached(workdir + ".json", compute)


@exit_on_user_error
def main(argv=None) -> None:
    args = parse_args(argv)
    prepared = budget.workdir_and_corpus(args)
    finetune_args = argparse.Namespace(
        # 0: every training sentence, not budget_pretraining's cap of 3,000
        max_train_examples=args.max_train_examples or 1_000_000,
        max_eval_examples=args.max_eval_examples,
        epochs=args.epochs, size="", workdir=args.workdir, pairs="")
    lines = ["| variant | steps in the budget | held-out MLM accuracy | sentiment (test) |",
             "|---|---|---|---|"]
    for name in args.variants:
        result = pretrain(args, name, prepared)
        scores = [budget.finetune(finetune_args, "sentiment", name, result["workdir"], prepared,
                                  seed)["score"] for seed in range(args.seeds)]
        mlm = result["eval"].get("eval_mlm_accuracy")
        lines.append(f"| {name} | {result['steps']} | "
                     f"{'—' if mlm is None else f'{100 * mlm:.1f}%'} | "
                     f"{100 * statistics.fmean(scores):.1f}% |")
        print(lines[-1], flush=True)
    print(f"\n{args.minutes:g} minutes each on configs/budget.py, {args.seeds} seed(s)\n")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
