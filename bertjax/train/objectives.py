"""Pretraining losses (MLM, NSP, SBO) and their metrics, kept as sums and weights.

Sums add up exactly across micro-batches, steps, devices and hosts; `summarize` divides only at
the end, so an average is never an average of averages.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping

import jax
import jax.numpy as jnp

from bertjax.train.step_metrics import CORRECT, COUNT, LOSS_SUM, WEIGHT, additive, name

EPS = 1e-8

# objective -> the sum it is averaged over: predictions' weights, or examples
NORMALIZERS = {"mlm": name("mlm", WEIGHT), "nsp": name("nsp", COUNT), "sbo": name("sbo", WEIGHT)}


def _cross_entropy(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per-example cross-entropy and correctness, in fp32 whatever the logits' dtype."""
    logits = logits.astype(jnp.float32)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    return nll, correct


def _masked_sums(objective: str, logits: jax.Array, batch: Mapping) -> dict[str, jax.Array]:
    weights = batch["masked_weights"].astype(jnp.float32)
    nll, correct = _cross_entropy(logits, batch["masked_ids"])
    return additive(objective, loss_sum=jnp.sum(weights * nll),
                    correct=jnp.sum(weights * correct), weight=jnp.sum(weights))


def metric_sums(outputs: Mapping[str, jax.Array], batch: Mapping) -> dict[str, jax.Array]:
    """Loss sums, correct counts and weights for every objective the model produced."""
    sums = _masked_sums("mlm", outputs["mlm_logits"], batch)
    if "sbo_logits" in outputs:
        # SBO predicts the same masked tokens as MLM, from the span boundaries.
        sums.update(_masked_sums("sbo", outputs["sbo_logits"], batch))
    if "nsp_logits" in outputs:
        nll, correct = _cross_entropy(outputs["nsp_logits"], batch["nsp_label"])
        sums.update(additive("nsp", loss_sum=jnp.sum(nll), correct=jnp.sum(correct),
                             count=jnp.asarray(nll.shape[0], jnp.float32)))
    return sums


def loss_from_sums(sums: Mapping[str, jax.Array],
                   normalizers: Mapping[str, jax.Array] | None = None) -> jax.Array:
    """Sum over present objectives of loss_sum / weight.

    `normalizers` (keys like "mlm_weight") override the weights in `sums`: a micro-batch divides
    by the WHOLE batch's weights so that micro-batch losses (and gradients) add up to the
    whole-batch loss exactly.
    """
    normalizers = sums if normalizers is None else normalizers
    total = jnp.zeros([], jnp.float32)
    for objective, weight_key in NORMALIZERS.items():
        if name(objective, LOSS_SUM) in sums:
            total += sums[name(objective, LOSS_SUM)] / jnp.maximum(normalizers[weight_key], EPS)
    return total


def batch_normalizers(batch: Mapping) -> dict[str, jax.Array]:
    """The weights each objective of a whole batch is averaged over (see `loss_from_sums`)."""
    weight = jnp.sum(batch["masked_weights"].astype(jnp.float32))
    count = jnp.asarray(batch["masked_weights"].shape[0], jnp.float32)
    return {NORMALIZERS["mlm"]: weight, NORMALIZERS["sbo"]: weight, NORMALIZERS["nsp"]: count}


def pretraining_loss(outputs: Mapping[str, jax.Array],
                     batch: Mapping) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(total loss, metric sums): weighted-mean MLM (+ SBO) cross-entropy plus mean NSP."""
    sums = metric_sums(outputs, batch)
    return loss_from_sums(sums), sums


def summarize(sums: Mapping[str, float]) -> dict[str, float]:
    """Accumulated sums -> losses, accuracies and MLM perplexity (only for present objectives)."""
    out: dict[str, float] = {}
    for objective, weight_key in NORMALIZERS.items():
        if name(objective, LOSS_SUM) not in sums:
            continue
        weight = max(float(sums[weight_key]), EPS)
        out[f"{objective}_loss"] = float(sums[name(objective, LOSS_SUM)]) / weight
        out[f"{objective}_accuracy"] = float(sums[name(objective, CORRECT)]) / weight
    if "mlm_loss" in out:
        # math.exp raises OverflowError past ~709; infinity is the honest value there.
        loss = out["mlm_loss"]
        out["mlm_perplexity"] = math.exp(loss) if loss < 709.0 else math.inf
    return out


@dataclasses.dataclass(frozen=True)
class StepObjective:
    """What the generic train/eval steps need to know of a task's loss.

    `metric_sums(outputs, batch)` -> sums (losses, correct counts, weights);
    `batch_normalizers(batch)` -> the whole batch's weights; `loss_from_sums(sums, normalizers)`
    -> the scalar loss. Fine-tuning tasks supply their own; pretraining uses the ones above.
    """

    metric_sums: Callable[[Mapping, Mapping], dict]
    batch_normalizers: Callable[[Mapping], dict]
    loss_from_sums: Callable[..., jax.Array]
    summarize: Callable[[Mapping[str, float]], dict]


PRETRAINING = StepObjective(metric_sums, batch_normalizers, loss_from_sums, summarize)
