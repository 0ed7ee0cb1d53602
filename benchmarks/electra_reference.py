"""An outside oracle for ELECTRA pretraining: our ElectraForPretraining, trained by the real job's
train step, next to Hugging Face transformers' ElectraForPreTraining + ElectraForMaskedLM
(PyTorch, CPU, fp32), from the SAME initial weights (ours, exported with hf_electra.to_hf; the
two torch models share one embeddings module and the generator's lm head is tied to its word
embeddings, as in the paper) on the SAME batches (drawn once from our pipeline), with the same
optimizer recipe (AdamW with bias correction, linear warmup then linear decay, global-norm
clipping, weight decay off LayerNorms and biases) and the same loss (generator MLM mean over the
masked predictions + lambda * discriminator BCE mean over real tokens, the latter computed by
ElectraForPreTraining itself). Each side samples its replacements from its own generator (Gumbel-max), so the
torch run is an independent reference for the learning dynamics, not a replay of ours.

Before training, a one-step check: same parameters, same batch and the SAME replacement samples
(ours, fed to torch for this check only): total loss and the gradients of named parameters, ours
against transformers'. Then every --every steps, both sides' window figures; at the end, both on
held-out batches. The job's configuration is benchmarks/pretraining_objectives.py's (tiny preset,
dropout 0, 20 predictions, 10% warmup, bias correction).

    python benchmarks/electra_reference.py [--steps 600] [--learning-rate 5e-4] [--batch-size 32]
        [--seq-len 128] [--every 50] [--eval-batches 8] [--corpus DIR] [--seed 0]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
import time

import jax
import numpy as np
import torch
import torch.nn.functional as F
from transformers import (ElectraConfig, ElectraForMaskedLM, ElectraForPreTraining,
                          get_linear_schedule_with_warmup)

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from pretraining_objectives import pretrain_overrides, prepare_corpus  # noqa: E402  (benchmarks/)

from bertjax.core import packaged  # noqa: E402
from bertjax.train.compilation import abstract_batch  # noqa: E402
from bertjax.core.errors import UserError, exit_on_user_error  # noqa: E402
from bertjax.interop import hf_electra  # noqa: E402
from bertjax.jobs import pretraining_data, pretraining_model  # noqa: E402
from bertjax.parallel import partitioning  # noqa: E402
from bertjax.settings import pretrain  # noqa: E402
from bertjax.train.logging_hook import window_summary  # noqa: E402
from bertjax.train.optimizer import decay_mask, make_optimizer  # noqa: E402
from bertjax.train.state import create_train_state  # noqa: E402
from bertjax.train.step import make_eval_step, make_train_step  # noqa: E402
from bertjax.train.warm_start import UNTRAINED_POOLER  # noqa: E402
from configs import electra as electra_config  # noqa: E402

SHOWN = (("gen MLM acc", "mlm_accuracy"), ("RTD loss", "rtd_loss"), ("RTD acc", "rtd_accuracy"),
         ("precision", "rtd_precision"), ("recall", "rtd_recall"),
         ("replaced", "replaced_fraction"))
CHECKED = ("electra.embeddings.word_embeddings.weight", "electra.embeddings.LayerNorm.weight",
           "electra.encoder.layer.0.attention.self.query.weight",
           "discriminator_predictions.dense_prediction.weight",
           "generator/electra.encoder.layer.1.output.dense.weight",
           "generator/generator_predictions.dense.weight", "generator/generator_lm_head.bias")


def parse_args(argv=None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=600)
    p.add_argument("--learning-rate", type=float, default=5e-4)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--seq-len", type=int, default=128)
    p.add_argument("--every", type=int, default=50)
    p.add_argument("--eval-batches", type=int, default=8)
    p.add_argument("--corpus", default="",
                   help="a prepared corpus (python -m bertjax.data.prepare); default: the demo Wikipedia "
                        "corpus of benchmarks/pretraining_objectives.py, prepared on first use")
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    if min(args.steps, args.batch_size, args.seq_len, args.every, args.eval_batches) < 1:
        raise UserError("--steps, --batch-size, --seq-len, --every and --eval-batches must be "
                        "positive")
    if not args.learning_rate > 0 or args.seed < 0:
        raise UserError("--learning-rate must be positive and --seed not negative")
    if not args.corpus:
        args.corpus = prepare_corpus(os.path.join(packaged.cache_dir(), "benchmarks",
                                                  "pretraining_objectives"))
    if not os.path.isfile(os.path.join(args.corpus, "manifest.json")):
        raise UserError(f"{args.corpus} is not a prepared corpus (no manifest.json)")
    args.size = "tiny"
    return args


def settings(args) -> pretrain.PretrainSettings:
    """The real job's settings: configs/electra.py with pretraining_objectives' budget."""
    config = electra_config.get_config()
    config.update_from_flattened_dict(pretrain_overrides(args, args.corpus))
    s = pretrain.read(config)
    o = s.optimizer
    if not (o.name == "adamw" and o.decay == "linear" and o.end_learning_rate == 0
            and o.bias_correction and o.clip_norm > 0):
        raise UserError(f"the torch side reproduces AdamW, linear decay to 0, bias correction "
                        f"and clipping only; got {o}")
    return s


def torch_models(params, encoder, heads) -> tuple[torch.nn.Module, torch.nn.Module]:
    """transformers' discriminator and generator holding our parameters, embeddings shared."""
    exported = hf_electra.to_hf(jax.device_get(params), encoder, heads)
    models = []
    for part, cls in (("", ElectraForPreTraining), (hf_electra.GENERATOR_DIR, ElectraForMaskedLM)):
        config = ElectraConfig.from_dict(exported[part].config)
        config._attn_implementation = "eager"
        model = cls(config)
        state = {k: torch.from_numpy(np.array(v, np.float32)) for k, v in
                 exported[part].state_dict.items()}
        model.load_state_dict(state, strict=True)
        models.append(model.train())
    disc, gen = models
    gen.electra.embeddings = disc.electra.embeddings
    gen.generator_lm_head.weight = disc.electra.embeddings.word_embeddings.weight
    return disc, gen


def hf_names(tree, encoder, heads) -> dict[str, np.ndarray]:
    """Our tree (parameters, gradients, masks) under transformers' names, generator's prefixed."""
    exported = hf_electra.to_hf(jax.device_get(tree), encoder, heads)
    return {(f"{part}/" if part else "") + k: np.asarray(v)
            for part, hf in exported.items() for k, v in hf.state_dict.items()}


def torch_named(disc, gen) -> dict[str, torch.nn.Parameter]:
    """Every torch parameter once, under hf_names' naming (shared ones under the discriminator's)."""
    named, seen = {}, set()
    for prefix, model in (("", disc), ("generator/", gen)):
        for k, p in model.named_parameters(remove_duplicate=False):
            if id(p) not in seen:
                seen.add(id(p))
                named[prefix + k] = p
    return named


def torch_optimizer(named, s, params, encoder, heads):
    """AdamW with transformers' usual no-decay rule (biases, LayerNorm), checked against ours."""
    no_decay = {k for k in named if k.endswith("bias") or "LayerNorm" in k}
    ours = hf_names(jax.tree.map(lambda d, p: np.full(np.shape(p), float(d)),
                                 decay_mask(params, (UNTRAINED_POOLER,)), params), encoder, heads)
    differ = [k for k in named if (k not in no_decay) != bool(ours[k].min() == 1.0)]
    if differ:
        raise UserError(f"weight-decay sets differ on {', '.join(differ)}")
    o = s.optimizer
    groups = [{"params": [p for k, p in named.items() if k not in no_decay],
               "weight_decay": o.weight_decay},
              {"params": [p for k, p in named.items() if k in no_decay], "weight_decay": 0.0}]
    optimizer = torch.optim.AdamW(groups, lr=o.learning_rate, betas=(o.b1, o.b2), eps=o.eps)
    return optimizer, get_linear_schedule_with_warmup(optimizer, o.warmup_steps, o.total_steps)


def torch_forward(disc, gen, b, lam: float, generator=None, samples=None):
    """(loss, our metric sums) of transformers' ELECTRA on one batch: samples from `generator`
    (Gumbel-max) unless `samples` [B, P] are given."""
    t = {k: torch.from_numpy(np.asarray(v)) for k, v in b.items()}
    ids, mask, segments = t["input_ids"].long(), t["input_mask"].long(), t["segment_ids"].long()
    used = t["masked_weights"] > 0
    rows = torch.arange(ids.shape[0])[:, None].expand_as(t["masked_positions"])[used]
    positions, originals = t["masked_positions"].long()[used], t["masked_ids"].long()[used]
    # ElectraForMaskedLM.forward with its per-token head applied at the masked positions only
    # (the same values; a full-vocabulary head over every token doubles the step's time).
    hidden = gen.electra(ids, attention_mask=mask, token_type_ids=segments).last_hidden_state
    logits = gen.generator_lm_head(gen.generator_predictions(hidden[rows, positions]))
    mlm = F.cross_entropy(logits, originals)
    if samples is None:
        uniform = torch.rand(logits.shape, generator=generator).clamp(1e-20, 1 - 1e-7)
        sampled = torch.argmax(logits.detach() - torch.log(-torch.log(uniform)), -1)
    else:
        sampled = torch.from_numpy(np.array(samples)).long()[used]
    corrupted, original = ids.clone(), ids.clone()
    corrupted[rows, positions], original[rows, positions] = sampled, originals
    labels = (corrupted != original).long()
    rtd = disc(input_ids=corrupted, attention_mask=mask, token_type_ids=segments, labels=labels)
    with torch.no_grad():
        real, y = mask.float(), labels.float()
        flagged = (rtd.logits > 0).float() * real
        caught = (flagged * y).sum()
        nll = F.binary_cross_entropy_with_logits(rtd.logits, y, reduction="none")
        sums = {"mlm_loss_sum": mlm * used.sum(), "mlm_weight": used.sum(),
                "mlm_correct": (logits.argmax(-1) == originals).sum(),
                "rtd_loss_sum": (nll * real).sum(), "rtd_weight": real.sum(),
                "rtd_correct": (real * (flagged == y)).sum(), "rtd_replaced_correct": caught,
                "rtd_replaced_weight": (y * real).sum(), "rtd_flagged_correct": caught,
                "rtd_flagged_weight": flagged.sum()}
    return mlm + lam * rtd.loss, {k: float(v) for k, v in sums.items()}


def one_step_difference(model, objective, params, disc, gen, b, lam, encoder, heads):
    """Same parameters, batch and replacement samples: (our loss, transformers' loss,
    {transformers name: (max |our gradient|, max |gradient difference|)})."""
    def loss(p):
        out = model.apply({"params": p}, b, deterministic=False,
                          rngs={"dropout": jax.random.PRNGKey(1)})
        return objective.loss_from_sums(objective.metric_sums(out, b)), out["sampled_ids"]

    # Jitted: op by op, the step compiles ~200 programs, one per primitive and shape.
    (ours, samples), grads = jax.jit(jax.value_and_grad(loss, has_aux=True))(params)
    named = torch_named(disc, gen)
    for p in named.values():
        p.grad = None
    theirs, _ = torch_forward(disc, gen, b, lam, samples=np.asarray(samples))
    theirs.backward()
    grads = hf_names(grads, encoder, heads)
    differences = {k: (float(np.abs(grads[k]).max()),
                       float(np.abs(grads[k] - p.grad.numpy()).max()))
                   for k, p in named.items()}
    for p in named.values():
        p.grad = None
    return float(ours), theirs.item(), differences


def print_one_step_check(ours: float, theirs: float, differences: dict) -> None:
    print(f"one-step check: loss ours {ours:.6f}, transformers {theirs:.6f} "
          f"(|diff| {abs(ours - theirs):.2e})")
    print("| parameter | max |grad| | max |diff| |\n|---|---|---|")
    for k in CHECKED:
        print(f"| {k} | {differences[k][0]:.3e} | {differences[k][1]:.2e} |")
    worst = max(diff for _, diff in differences.values())
    print(f"max |gradient diff| over all {len(differences)} torch parameters: {worst:.2e}\n")


@dataclasses.dataclass
class TorchSide:
    """transformers' ELECTRA in training: its models, optimizer and schedule, and its sampler."""
    disc: torch.nn.Module
    gen: torch.nn.Module
    named: dict
    optimizer: torch.optim.Optimizer
    schedule: object
    lam: float
    clip_norm: float
    sampler: torch.Generator

    def train_step(self, b) -> dict:
        """One step as transformers' Trainer takes it; the step's metric sums."""
        loss, sums = torch_forward(self.disc, self.gen, b, self.lam, generator=self.sampler)
        self.optimizer.zero_grad()
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.named.values(), self.clip_norm)
        self.optimizer.step()
        self.schedule.step()
        return sums

    def held_out(self, batches, seed: int) -> list[dict]:
        """Metric sums on held-out batches (no gradient, samples from a sampler of `seed`)."""
        sampler = torch.Generator().manual_seed(seed)
        self.disc.eval(), self.gen.eval()
        with torch.no_grad():
            return [torch_forward(self.disc, self.gen, b, self.lam, generator=sampler)[1]
                    for b in batches]


def row(step, label, figures) -> str:
    return (f"| {step} | {label} | " + " | ".join(f"{figures[k]:.3f}" for _, k in SHOWN) + " |")


HEADER = ("| step | side | " + " | ".join(label for label, _ in SHOWN) + " |\n|---|---|"
          + "---|" * len(SHOWN))


@exit_on_user_error
def main(argv=None) -> None:
    args = parse_args(argv)
    # The tiny model gains nothing from intra-op threads; on 2 shared cores, 2 threads made
    # the torch step 5x slower than 1.
    torch.set_num_threads(1)
    s = settings(args)
    prepared = pretraining_data.prepared_corpus(s, "", None, may_prepare=False)
    tokenizer = prepared.tokenizer
    encoder = s.model.encoder(tokenizer.vocab_size, tokenizer.special.pad)
    model, objective = pretraining_model.build(s, encoder)
    heads = pretraining_model.heads_record(s, encoder)
    lam = s.objective.electra.discriminator_weight
    mesh = s.mesh.make()
    phase = s.schedule.phase_at(0)
    shapes = abstract_batch(args.batch_size, phase.seq_len, phase.max_predictions, nsp=False,
                            span=False, sharding=partitioning.batch_sharding(mesh))
    optimizer = make_optimizer(s.optimizer, untrained=(UNTRAINED_POOLER,))
    state, shardings = create_train_state(model, optimizer, shapes, mesh, s.train.seed)
    train_step = make_train_step(model, optimizer, mesh, shardings, objective=objective)
    eval_step = make_eval_step(model, mesh, shardings, objective=objective)

    disc, gen = torch_models(state.params, encoder, heads)
    named = torch_named(disc, gen)
    torch_opt, torch_schedule = torch_optimizer(named, s, state.params, encoder, heads)
    data = pretraining_data.batches(s, prepared)
    batches = data.train_iterator(0)
    first = next(batches)
    print_one_step_check(*one_step_difference(model, objective, state.params, disc, gen, first,
                                              lam, encoder, heads))

    theirs = TorchSide(disc, gen, named, torch_opt, torch_schedule, lam, s.optimizer.clip_norm,
                       torch.Generator().manual_seed(args.seed))
    wall = {"ours": 0.0, "transformers": 0.0}
    window = {"ours": [], "transformers": []}
    print(f"{s.model.preset} L={encoder.num_layers} H={encoder.hidden_size} (generator "
          f"H={pretraining_model.generator_of(s, encoder).hidden_size}), {args.steps} steps of "
          f"{args.batch_size} x {phase.seq_len}, lr {args.learning_rate:g}, warmup "
          f"{s.optimizer.warmup_steps}, lambda {lam:g}, seed {args.seed}\n\n{HEADER}", flush=True)
    for step in range(1, args.steps + 1):
        b = first if step == 1 else next(batches)
        started = time.perf_counter()
        state, metrics = train_step(state, partitioning.global_batch(b, mesh))
        window["ours"].append(jax.device_get(metrics))
        wall["ours"] += time.perf_counter() - started
        started = time.perf_counter()
        window["transformers"].append(theirs.train_step(b))
        wall["transformers"] += time.perf_counter() - started
        if step % args.every == 0 or step == args.steps:
            for side in window:
                print(row(step, side, window_summary(window[side], objective.summarize)),
                      flush=True)
                window[side] = []
    batches.close()

    held_out = data.eval_batches(phase, args.eval_batches)
    ours = [eval_step(state.params, partitioning.global_batch(b, mesh)) for b in held_out]
    print(f"\nheld out ({args.eval_batches} batches of {args.batch_size}):\n\n{HEADER}")
    print(row(args.steps, "ours", window_summary(jax.device_get(ours), objective.summarize)))
    print(row(args.steps, "transformers", window_summary(theirs.held_out(held_out, args.seed),
                                                        objective.summarize)))
    print(f"\ntraining wall time: ours {wall['ours']:.0f} s (compilation included), "
          f"transformers {wall['transformers']:.0f} s")


if __name__ == "__main__":
    main()
