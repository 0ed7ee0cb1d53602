"""Pretraining parity over a long run: our BertForPretraining (MLM + NSP), trained by the real job's
train step, next to Hugging Face transformers' BertForPreTraining (PyTorch, CPU, fp32), from the
SAME initial weights (ours, exported with hf_models.to_hf, a bit-exact transpose/reshape), on the
SAME batches (drawn once from our pipeline, masks included, fed to both), with the same optimizer
(AdamW with bias correction; transformers' own no-decay rule, checked against ours; linear warmup
then linear decay to 0; global-norm clipping) and dropout 0. The only differences left are the
frameworks' fp32 arithmetic, so the two loss curves coincide until rounding, amplified by
training, parts them; the report says where and by how much.

Every step's total loss, MLM and NSP losses and MLM accuracy are recorded for both sides
(DIR/steps.json); every --every steps a table row compares them; DIR/bert_reference.png draws
both curves and their difference. The job's configuration is configs/base.py with
benchmarks/pretraining_objectives.py's budget (tiny preset, dropout 0, 15% predictions, 10%
warmup, bias correction).

    python benchmarks/bert_reference.py --output-dir DIR [--steps 2000] [--learning-rate 1e-3]
        [--batch-size 16] [--seq-len 64] [--every 100] [--corpus DIR] [--seed 0]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import jax
import numpy as np
import torch
import torch.nn.functional as F
from transformers import (BertConfig, BertForPreTraining, Trainer,
                          get_linear_schedule_with_warmup)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from pretraining_objectives import pretrain_overrides, prepare_corpus  # noqa: E402  (benchmarks/)

from bertjax.core import packaged  # noqa: E402
from bertjax.core.errors import UserError, exit_on_user_error  # noqa: E402
from bertjax.interop import hf_layout, hf_models  # noqa: E402
from bertjax.jobs import pretraining_data, pretraining_model  # noqa: E402
from bertjax.parallel import partitioning  # noqa: E402
from bertjax.settings import pretrain  # noqa: E402
from bertjax.train import objectives  # noqa: E402
from bertjax.train.compilation import abstract_batch  # noqa: E402
from bertjax.train.optimizer import decay_mask, make_optimizer  # noqa: E402
from bertjax.train.state import create_train_state  # noqa: E402
from bertjax.train.step import make_train_step  # noqa: E402
from configs import base as base_config  # noqa: E402

SIDES = ("bertjax", "transformers")
FIGURES = ("loss", "mlm_loss", "nsp_loss", "mlm_accuracy")
THRESHOLDS = (1e-5, 1e-4, 1e-3, 1e-2, 1e-1)
PLOT_FILE, STEPS_FILE = "bert_reference.png", "steps.json"


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output-dir", required=True, help="where the PNG and steps.json go")
    p.add_argument("--steps", type=int, default=2000)
    p.add_argument("--learning-rate", type=float, default=1e-3)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--seq-len", type=int, default=64)
    p.add_argument("--every", type=int, default=100, help="steps per table row (a window)")
    p.add_argument("--corpus", default="",
                   help="a prepared corpus; default: benchmarks/pretraining_objectives.py's demo "
                        "Wikipedia corpus, prepared on first use")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if min(args.steps, args.batch_size, args.seq_len, args.every) < 1:
        raise UserError("--steps, --batch-size, --seq-len and --every must be positive")
    if not args.learning_rate > 0 or args.seed < 0:
        raise UserError("--learning-rate must be positive and --seed not negative")
    if not args.corpus:
        args.corpus = prepare_corpus(os.path.join(packaged.cache_dir(), "benchmarks",
                                                  "pretraining_objectives"))
    if not os.path.isfile(os.path.join(args.corpus, "manifest.json")):
        raise UserError(f"{args.corpus} is not a prepared corpus (no manifest.json)")
    args.size, args.eval_batches = "tiny", 1  # pretrain_overrides' remaining fields
    return args


def settings(args) -> pretrain.PretrainSettings:
    """The real job's settings: configs/base.py (BERT, MLM + NSP) with the shared budget."""
    config = base_config.get_config()
    config.update_from_flattened_dict(pretrain_overrides(args, args.corpus))
    # Batches built in this process: spawned builders take seconds to start and contend for the
    # cores, and batch building is outside both sides' timing anyway.
    config.data.workers = 0
    s = pretrain.read(config)
    o = s.optimizer
    if not (o.name == "adamw" and o.decay == "linear" and o.end_learning_rate == 0
            and o.bias_correction and o.clip_norm > 0 and s.objective.nsp):
        raise UserError(f"the torch side reproduces MLM + NSP with AdamW, linear decay to 0, "
                        f"bias correction and clipping only; got {o}")
    return s


def torch_model(params, encoder, heads) -> BertForPreTraining:
    """transformers' BertForPreTraining holding our parameters (decoder tied to the embeddings)."""
    exported = hf_models.to_hf(jax.device_get(params), encoder, heads)
    config = BertConfig.from_dict(exported.config)
    config._attn_implementation = "eager"  # the reference implementation, not a fused kernel
    model = BertForPreTraining(config)
    model.load_state_dict({k: torch.from_numpy(np.array(v, np.float32))
                           for k, v in exported.state_dict.items()}, strict=True)
    return model.train()


def torch_optimizer(model, s, params, encoder):
    """AdamW over transformers' Trainer decay groups, refused unless they are ours."""
    decayed = set(Trainer.get_decay_parameter_names(None, model))
    ours = hf_layout.to_hf_state_dict(jax.tree.map(
        lambda d, p: np.full(np.shape(p), float(d), np.float32), decay_mask(params), params),
        encoder)
    named = dict(model.named_parameters())
    differ = [k for k in named if (k in decayed) != bool(ours[k].min() == 1.0)]
    if differ:
        raise UserError(f"weight-decay sets differ on {', '.join(differ)}")
    o = s.optimizer
    groups = [{"params": [p for k, p in named.items() if k in decayed],
               "weight_decay": o.weight_decay},
              {"params": [p for k, p in named.items() if k not in decayed], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=o.learning_rate, betas=(o.b1, o.b2), eps=o.eps)
    return optimizer, get_linear_schedule_with_warmup(optimizer, o.warmup_steps, o.total_steps)


def torch_forward(model: BertForPreTraining, b) -> tuple[torch.Tensor, dict]:
    """(loss, our metric sums) of transformers' BERT on one of our batches. The MLM head runs at
    the masked slots only, as ours does: the same values as its every-position head (the test
    checks the loss against model(labels=...)), without a vocabulary-wide matmul per token."""
    t = {k: torch.from_numpy(np.asarray(v)) for k, v in b.items()}
    out = model.bert(t["input_ids"].long(), attention_mask=t["input_mask"].long(),
                     token_type_ids=t["segment_ids"].long())
    positions = t["masked_positions"].long()
    gathered = torch.gather(out.last_hidden_state, 1,
                            positions[..., None].expand(-1, -1, out.last_hidden_state.shape[-1]))
    mlm_logits, nsp_logits = model.cls(gathered, out.pooler_output)
    weights, originals = t["masked_weights"].float(), t["masked_ids"].long()
    nll = F.cross_entropy(mlm_logits.transpose(1, 2), originals, reduction="none")
    nsp_labels = t["nsp_label"].long()
    nsp_nll = F.cross_entropy(nsp_logits, nsp_labels, reduction="none")
    loss = (weights * nll).sum() / weights.sum() + nsp_nll.mean()
    with torch.no_grad():
        sums = {"mlm_loss_sum": (weights * nll).sum(), "mlm_weight": weights.sum(),
                "mlm_correct": (weights * (mlm_logits.argmax(-1) == originals)).sum(),
                "nsp_loss_sum": nsp_nll.sum(), "nsp_count": torch.tensor(float(len(nsp_nll))),
                "nsp_correct": (nsp_logits.argmax(-1) == nsp_labels).sum()}
    return loss, {k: float(v) for k, v in sums.items()}


def torch_step(model, optimizer, schedule, clip_norm: float, b) -> dict:
    """One step as transformers' Trainer takes it; the step's metric sums."""
    loss, sums = torch_forward(model, b)
    optimizer.zero_grad()
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), clip_norm)
    optimizer.step()
    schedule.step()
    return sums


def figures(sums) -> dict[str, float]:
    """One step's FIGURES from its metric sums, the same arithmetic for both sides."""
    out = objectives.summarize({k: float(np.asarray(v)) for k, v in sums.items()
                                if k.endswith(("_sum", "_weight", "_count", "_correct"))})
    return {"loss": out["mlm_loss"] + out["nsp_loss"], **{k: out[k] for k in FIGURES[1:]}}


def parting(records: dict) -> dict:
    """Where the total losses part: the first step past each threshold, the largest gap."""
    gap = np.abs(np.subtract(records["bertjax"]["loss"], records["transformers"]["loss"]))
    first = {f"{t:g}": (int(np.argmax(gap > t)) + 1 if (gap > t).any() else None)
             for t in THRESHOLDS}
    return {"max_abs_loss_diff": float(gap.max()), "at_step": int(gap.argmax()) + 1,
            "first_step_over": first}


def table(records: dict, every: int) -> str:
    """Per window: mean loss and MLM accuracy of each side, their differences, the largest
    per-step gaps of the total, MLM and NSP losses."""
    ours, theirs = records["bertjax"], records["transformers"]
    rows = ["| steps | loss bertjax | loss HF | max abs diff loss | MLM loss | NSP loss "
            "| MLM acc bertjax | MLM acc HF | diff MLM acc |", "|---" * 9 + "|"]
    for start in range(0, len(ours["loss"]), every):
        window = slice(start, start + every)
        mean = {k: (np.mean(ours[k][window]), np.mean(theirs[k][window])) for k in FIGURES}
        gap = {k: np.abs(np.subtract(ours[k][window], theirs[k][window])).max() for k in FIGURES}
        end = min(start + every, len(ours["loss"]))
        rows.append(f"| {start + 1}-{end} | {mean['loss'][0]:.4f} | {mean['loss'][1]:.4f} | "
                    f"{gap['loss']:.1e} | {gap['mlm_loss']:.1e} | {gap['nsp_loss']:.1e} | "
                    f"{mean['mlm_accuracy'][0]:.4f} | {mean['mlm_accuracy'][1]:.4f} | "
                    f"{mean['mlm_accuracy'][0] - mean['mlm_accuracy'][1]:+.4f} |")
    return "\n".join(rows)


def plot(records: dict, path: str) -> None:
    import matplotlib  # deferred: only the end of the run draws

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    steps = np.arange(1, len(records["bertjax"]["loss"]) + 1)
    fig, axes = plt.subplots(1, 3, figsize=(15, 4))
    for key, ax in zip(("loss", "mlm_accuracy"), axes):
        for side, style in zip(SIDES, ("-", "--")):
            ax.plot(steps, records[side][key], style, lw=0.8, label=side)
        ax.set_title(f"{key.replace('_', ' ')} per step")
    gap = np.abs(np.subtract(records["bertjax"]["loss"], records["transformers"]["loss"]))
    axes[2].semilogy(steps, np.maximum(gap, 1e-9), lw=0.6)
    axes[2].set_title("|loss difference| (bertjax - transformers)")
    for ax in axes:
        ax.set_xlabel("step")
        ax.grid(alpha=0.3)
    axes[0].legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def train_both(args, s) -> tuple[dict, dict]:
    """Both sides trained on the same batches: (per-step FIGURES per side, wall seconds)."""
    prepared = pretraining_data.prepared_corpus(s, "", None, may_prepare=False)
    encoder = s.model.encoder(prepared.tokenizer.vocab_size, prepared.tokenizer.special.pad)
    model, objective = pretraining_model.build(s, encoder)
    mesh = s.mesh.make()
    phase = s.schedule.phase_at(0)
    shapes = abstract_batch(args.batch_size, phase.seq_len, phase.max_predictions, nsp=True,
                            span=False, sharding=partitioning.batch_sharding(mesh))
    optimizer = make_optimizer(s.optimizer)  # NSP trains the pooler: nothing left untrained
    state, shardings = create_train_state(model, optimizer, shapes, mesh, s.train.seed)
    train_step = make_train_step(model, optimizer, mesh, shardings, objective=objective)
    hf = torch_model(state.params, encoder, pretraining_model.heads_record(s, encoder))
    hf_optimizer, hf_schedule = torch_optimizer(hf, s, jax.device_get(state.params), encoder)
    print(f"{s.model.preset} L={encoder.num_layers} H={encoder.hidden_size} "
          f"V={encoder.vocab_size}, {args.steps} steps of {args.batch_size} x {phase.seq_len} "
          f"({phase.max_predictions} predictions), lr {args.learning_rate:g}, warmup "
          f"{s.optimizer.warmup_steps}, seed {args.seed}", flush=True)
    records = {side: {k: [] for k in FIGURES} for side in SIDES}
    wall = dict.fromkeys(SIDES, 0.0)
    batches = pretraining_data.batches(s, prepared).train_iterator(0)
    for step in range(1, args.steps + 1):
        b = next(batches)
        started = time.perf_counter()
        state, metrics = train_step(state, partitioning.global_batch(b, mesh))
        result = {"bertjax": figures(jax.device_get(metrics))}
        wall["bertjax"] += time.perf_counter() - started
        started = time.perf_counter()
        result["transformers"] = figures(torch_step(hf, hf_optimizer, hf_schedule,
                                                    s.optimizer.clip_norm, b))
        wall["transformers"] += time.perf_counter() - started
        for side in SIDES:
            for k in FIGURES:
                records[side][k].append(result[side][k])
        if step % args.every == 0 or step == args.steps:
            print(f"step {step}: loss {result['bertjax']['loss']:.5f} / "
                  f"{result['transformers']['loss']:.5f}", flush=True)
    batches.close()
    return records, wall


@exit_on_user_error
def main(argv=None) -> None:
    args = parse_args(argv)
    # The tiny model gains nothing from intra-op threads on 2 shared cores (electra_reference).
    torch.set_num_threads(1)
    s = settings(args)
    os.makedirs(args.output_dir, exist_ok=True)
    records, wall = train_both(args, s)
    summary = parting(records)
    with open(os.path.join(args.output_dir, STEPS_FILE), "w") as f:
        json.dump({"args": {k: v for k, v in vars(args).items()}, "summary": summary,
                   "wall_s": wall, "steps": records}, f)
    plot(records, os.path.join(args.output_dir, PLOT_FILE))
    print(f"\n{table(records, args.every)}\n")
    over = ", ".join(f"{t}: {'never' if step is None else f'step {step}'}"
                     for t, step in summary["first_step_over"].items())
    print(f"max |loss difference| {summary['max_abs_loss_diff']:.2e} at step "
          f"{summary['at_step']}; first step past each threshold: {over}")
    print(f"training wall time: bertjax {wall['bertjax']:.0f} s (compilation included), "
          f"transformers {wall['transformers']:.0f} s; wrote {args.output_dir}/{PLOT_FILE} and "
          f"{STEPS_FILE}")


if __name__ == "__main__":
    main()
