"""The transformers peer of a wall-clock-budget pretraining comparison: Hugging Face's PyTorch
BertForMaskedLM (no NSP), with the size of a bertjax preset and HF's own random init, pretrained
for a fixed number of minutes on a bertjax prepared corpus, read through bertjax's batch iterator
(the same examples and masks as a bertjax run of the same config, batch, length and seed).

The step is the library's as users train it: forward with labels at the masked slots (-100
elsewhere; its head scores every position), backward, clip_grad_norm_, torch.optim.AdamW (bias
correction, weight decay off biases and LayerNorms by transformers' Trainer rule). The learning
rate is laid over the budget, not over steps: with p = elapsed / budget (elapsed counted from the
start of `run`, model build and data set-up included, evaluation and saving too), the rate is
peak * p / warmup_fraction while p < warmup_fraction, then falls linearly to 0 at p = 1. As p
crosses each --save-at fraction the model is saved (save_pretrained plus the vocabulary, which
`python -m bertjax.convert --from-hf` imports) and scored on held-out batches (MLM accuracy).
The recipe is --config's (default configs/budget.py: its masking, prediction slots, held-out
documents, optimizer keys, peak rate and warmup share), dropout 0; summary.json holds the result.

    python benchmarks/transformers_budget.py --prepared DIR --minutes M --output-dir OUT
        [--preset tiny] [--batch-size 32] [--seq-len 128] [--learning-rate 1e-3]
        [--warmup-fraction 0.1] [--save-at 0.25,0.5,1] [--config configs/budget.py]
        [--b1 B1] [--b2 B2] [--eps EPS] [--weight-decay WD] [--clip-norm C]  (default: the config's)
        [--eval-batches 8] [--seed 0] [--threads N] [--data-workers N]
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time

import numpy as np
import torch
import transformers
# Imported here, not when first used: transformers loads its modules lazily, and the Trainer's
# (for its decay rule) take seconds, which are not the run's.
from transformers import BertForMaskedLM, Trainer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bertjax.bench.torch_peer import hf_config  # noqa: E402
from bertjax.core.errors import UserError, exit_on_user_error  # noqa: E402
from bertjax.interop import hf_files  # noqa: E402
from bertjax.jobs import pretraining_data  # noqa: E402
from bertjax.settings import pretrain  # noqa: E402

SUMMARY_FILE = "summary.json"
OPTIMIZER_KEYS = ("b1", "b2", "eps", "weight_decay", "clip_norm")
# A cap on steps only: the budget ends the run first.
STEP_CAP = 10**9


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--prepared", required=True, help="a bertjax prepared corpus")
    p.add_argument("--minutes", type=float, required=True, help="the wall-clock budget")
    p.add_argument("--output-dir", required=True)
    p.add_argument("--preset", default="tiny", help="bertjax model.preset: tiny | mini | small ...")
    p.add_argument("--batch-size", type=int, default=32)
    # Default: the config's (schedule.short_seq_len, optimizer.learning_rate, and
    # optimizer.warmup_steps / train.steps, which a time budget makes the warmup's share).
    p.add_argument("--seq-len", type=int, default=None)
    p.add_argument("--learning-rate", type=float, default=None)
    p.add_argument("--warmup-fraction", type=float, default=None)
    p.add_argument("--save-at", default="0.25,0.5,1", help="budget fractions, comma-separated")
    p.add_argument("--config", default="configs/budget.py",
                   help="the bertjax pretraining config whose recipe (examples, masking, "
                        "optimizer) the peer follows; NSP labels are not used")
    for name in OPTIMIZER_KEYS:  # default: the config's (budget.py: b2 0.98)
        p.add_argument(f"--{name.replace('_', '-')}", type=float, default=None)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0: os.cpu_count())")
    p.add_argument("--data-workers", type=int, default=-1,
                   help="background batch builders (-1: the config's data.workers)")
    args = p.parse_args(argv)
    try:
        args.save_at = sorted({float(f) for f in args.save_at.split(",") if f.strip()})
    except ValueError:
        raise UserError(f"--save-at takes fractions like 0.25,0.5,1, got "
                        f"{args.save_at!r}") from None
    if not args.save_at or not all(0 < f <= 1 for f in args.save_at):
        raise UserError("--save-at fractions must be in (0, 1]")
    if not args.minutes > 0:
        raise UserError("--minutes must be positive")
    if min(args.batch_size, args.seq_len or 1, args.eval_batches) < 1 or min(args.seed,
                                                                              args.threads) < 0:
        raise UserError("--batch-size, --seq-len and --eval-batches must be positive, --seed "
                        "and --threads not negative")
    if not os.path.isfile(os.path.join(args.prepared, "manifest.json")):
        raise UserError(f"{args.prepared} is not a prepared corpus (no manifest.json)")
    return args


def settings(args) -> pretrain.PretrainSettings:
    """The bertjax job's settings for the same data: --config with the benchmark's budget; the
    rate, warmup share, length and optimizer keys not given on the command line are its."""
    module = args.config.removesuffix(".py").replace("/", ".")  # configs/budget.py
    config = importlib.import_module(module).get_config()
    warmup = config.optimizer.warmup_steps / config.train.steps  # the budget's warmup share
    overrides = {"data.prepared": args.prepared, "model.preset": args.preset,
                 "train.batch_size": args.batch_size, "train.seed": args.seed,
                 "train.steps": STEP_CAP, "train.eval_batches": args.eval_batches,
                 "model.hidden_dropout": 0.0, "model.attention_dropout": 0.0,
                 "schedule.long_fraction": 0.0}
    if args.seq_len:
        overrides["schedule.short_seq_len"] = args.seq_len
    if args.data_workers >= 0:
        overrides["data.workers"] = args.data_workers
    config.update_from_flattened_dict(overrides)
    s = pretrain.read(config)
    if args.learning_rate is None:
        args.learning_rate = s.optimizer.learning_rate
    if args.warmup_fraction is None:
        args.warmup_fraction = warmup
    if not (args.learning_rate > 0 and 0 <= args.warmup_fraction < 1):
        raise UserError("--learning-rate must be positive and --warmup-fraction in [0, 1)")
    for name in OPTIMIZER_KEYS:
        if getattr(args, name) is None:
            setattr(args, name, getattr(s.optimizer, name))
    return s


def learning_rate(peak: float, p: float, warmup: float) -> float:
    """The budget schedule at progress p: linear warmup over `warmup`, linear decay to 0 at 1."""
    if p < warmup:
        return peak * p / warmup
    return peak * max(0.0, 1.0 - p) / (1.0 - warmup)


def hf_inputs(b: dict) -> dict:
    """Our batch -> BertForMaskedLM's arguments: labels at the used masked slots, -100 elsewhere."""
    ids = b["input_ids"]
    labels = np.full(ids.shape, -100, np.int64)
    used = b["masked_weights"] > 0
    rows = np.broadcast_to(np.arange(ids.shape[0])[:, None], used.shape)
    labels[rows[used], b["masked_positions"][used]] = b["masked_ids"][used]
    return {"input_ids": torch.from_numpy(ids.astype(np.int64)),
            "token_type_ids": torch.from_numpy(b["segment_ids"].astype(np.int64)),
            "attention_mask": torch.from_numpy(b["input_mask"].astype(np.int64)),
            "labels": torch.from_numpy(labels)}


def evaluate(model, batches) -> dict:
    """Held-out MLM loss and accuracy, weighted over the masked slots as bertjax's eval is."""
    model.eval()
    loss = correct = weight = 0.0
    with torch.no_grad():
        for b in batches:
            inputs = hf_inputs(b)
            del inputs["labels"]
            logits = model(**inputs).logits
            positions = torch.from_numpy(b["masked_positions"].astype(np.int64))
            scores = torch.gather(logits, 1, positions[..., None].expand(-1, -1, logits.shape[-1]))
            ids = torch.from_numpy(b["masked_ids"].astype(np.int64))
            w = torch.from_numpy(b["masked_weights"].astype(np.float32))
            nll = torch.nn.functional.cross_entropy(scores.transpose(1, 2), ids, reduction="none")
            loss += float((w * nll).sum())
            correct += float((w * (scores.argmax(-1) == ids)).sum())
            weight += float(w.sum())
    model.train()
    return {"eval_mlm_loss": loss / weight, "eval_mlm_accuracy": correct / weight}


def build(args, s, prepared):
    """(model, optimizer): HF's own init of the preset's shape; AdamW on Trainer's groups."""
    torch.manual_seed(args.seed)
    encoder = s.model.encoder(prepared.tokenizer.vocab_size, prepared.tokenizer.special.pad)
    model = BertForMaskedLM(hf_config(encoder)).train()
    decayed = set(Trainer.get_decay_parameter_names(None, model))
    named = list(model.named_parameters())
    groups = [{"params": [p for n, p in named if n in decayed], "weight_decay": args.weight_decay},
              {"params": [p for n, p in named if n not in decayed], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=0.0, betas=(args.b1, args.b2), eps=args.eps)
    return model, optimizer


def save_point(args, model, tokenizer, eval_batches, fraction, progress) -> dict:
    """The model at one budget fraction: saved where convert --from-hf reads it, and scored."""
    path = os.path.join(args.output_dir, f"at-{fraction:g}")
    model.save_pretrained(path)
    warning = hf_files.write_tokenizer(path, tokenizer, model.config.max_position_embeddings)
    if warning:
        print(f"warning: {warning}", file=sys.stderr)
    return {"fraction": fraction, "progress": round(progress, 4), "path": path,
            **evaluate(model, eval_batches)}


def run(args) -> dict:
    """Pretrains for the budget; the summary (also written to OUTPUT_DIR/summary.json)."""
    started = time.perf_counter()
    budget_s = args.minutes * 60.0
    threads = args.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    s = settings(args)
    prepared = pretraining_data.prepared_corpus(s, "", None, may_prepare=False)
    model, optimizer = build(args, s, prepared)
    data = pretraining_data.batches(s, prepared)
    phase = s.schedule.phase_at(0)
    eval_batches = data.eval_batches(phase, args.eval_batches)
    os.makedirs(args.output_dir, exist_ok=True)
    batches = data.train_iterator(0)
    # The first batch waits for the builders to start (seconds): part of the budget, as in a
    # bertjax run, but not of the steps' rate.
    first = next(batches)
    pending, points = list(args.save_at), []
    steps = tokens = real_tokens = 0
    train_s = last_loss = 0.0
    progress = (time.perf_counter() - started) / budget_s
    while progress < 1.0:
        step_started = time.perf_counter()
        for group in optimizer.param_groups:
            group["lr"] = learning_rate(args.learning_rate, progress, args.warmup_fraction)
        b = first if steps == 0 else next(batches)
        loss = model(**hf_inputs(b)).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        if args.clip_norm > 0:
            torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip_norm)
        optimizer.step()
        last_loss = float(loss.detach())
        steps, tokens = steps + 1, tokens + b["input_ids"].size
        real_tokens += int(b["input_mask"].sum())
        train_s += time.perf_counter() - step_started
        progress = (time.perf_counter() - started) / budget_s
        while pending and pending[0] < 1.0 and progress >= pending[0]:
            points.append({"step": steps, **save_point(args, model, prepared.tokenizer,
                                                       eval_batches, pending.pop(0), progress)})
            progress = (time.perf_counter() - started) / budget_s
    batches.close()
    for fraction in pending:  # 1.0: the end of the budget
        points.append({"step": steps, **save_point(args, model, prepared.tokenizer, eval_batches,
                                                   fraction, progress)})
    summary = {
        "steps": steps, "budget_s": budget_s, "elapsed_s": time.perf_counter() - started,
        "train_s": train_s, "tokens": tokens, "real_tokens": real_tokens,
        # Padded tokens per second of the training steps (batch building included), and per
        # second of the whole budget (start-up, evaluation and saving included).
        "tokens_per_s": tokens / max(train_s, 1e-9), "tokens_per_s_budget": tokens / budget_s,
        "last_train_loss": last_loss, "points": points, "threads": threads,
        "batch_size": args.batch_size, "seq_len": phase.seq_len,
        "max_predictions": phase.max_predictions, "preset": args.preset,
        "config": args.config, "mask_prob": s.masking.mask_prob, "learning_rate": args.learning_rate,
        "warmup_fraction": args.warmup_fraction, **{k: getattr(args, k) for k in OPTIMIZER_KEYS},
        "versions": {"torch": torch.__version__, "transformers": transformers.__version__}}
    with open(os.path.join(args.output_dir, SUMMARY_FILE), "w") as f:
        json.dump(summary, f, indent=1)
    return summary


@exit_on_user_error
def main(argv=None) -> None:
    print(json.dumps(run(parse_args(argv)), indent=1))


if __name__ == "__main__":
    main()
