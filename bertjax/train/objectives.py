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

EPS = 1e-8

# objective -> (its loss-sum key, the key holding the weight it is averaged over)
NORMALIZERS = {"mlm": "mlm_weight", "nsp": "nsp_count", "sbo": "sbo_weight"}


def _cross_entropy(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
    """Per-example cross-entropy and correctness, in fp32 whatever the logits' dtype."""
    logits = logits.astype(jnp.float32)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(log_probs, labels[..., None], axis=-1)[..., 0]
    correct = (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)
    return nll, correct


def _masked_sums(name: str, logits: jax.Array, batch: Mapping) -> dict[str, jax.Array]:
    weights = batch["masked_weights"].astype(jnp.float32)
    nll, correct = _cross_entropy(logits, batch["masked_ids"])
    return {f"{name}_loss_sum": jnp.sum(weights * nll),
            f"{name}_correct": jnp.sum(weights * correct),
            f"{name}_weight": jnp.sum(weights)}


def metric_sums(outputs: Mapping[str, jax.Array], batch: Mapping) -> dict[str, jax.Array]:
    """Loss sums, correct counts and weights for every objective the model produced."""
    sums = _masked_sums("mlm", outputs["mlm_logits"], batch)
    if "sbo_logits" in outputs:
        # SBO predicts the same masked tokens as MLM, from the span boundaries.
        sums.update(_masked_sums("sbo", outputs["sbo_logits"], batch))
    if "nsp_logits" in outputs:
        nll, correct = _cross_entropy(outputs["nsp_logits"], batch["nsp_label"])
        sums.update(nsp_loss_sum=jnp.sum(nll), nsp_correct=jnp.sum(correct),
                    nsp_count=jnp.asarray(nll.shape[0], jnp.float32))
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
        if f"{objective}_loss_sum" in sums:
            total += sums[f"{objective}_loss_sum"] / jnp.maximum(normalizers[weight_key], EPS)
    return total


def batch_normalizers(batch: Mapping) -> dict[str, jax.Array]:
    """The weights each objective of a whole batch is averaged over (see `loss_from_sums`)."""
    weight = jnp.sum(batch["masked_weights"].astype(jnp.float32))
    count = jnp.asarray(batch["masked_weights"].shape[0], jnp.float32)
    return {"mlm_weight": weight, "sbo_weight": weight, "nsp_count": count}


def pretraining_loss(outputs: Mapping[str, jax.Array],
                     batch: Mapping) -> tuple[jax.Array, dict[str, jax.Array]]:
    """(total loss, metric sums): weighted-mean MLM (+ SBO) cross-entropy plus mean NSP."""
    sums = metric_sums(outputs, batch)
    return loss_from_sums(sums), sums


def summarize(sums: Mapping[str, float]) -> dict[str, float]:
    """Accumulated sums -> losses, accuracies and MLM perplexity (only for present objectives)."""
    out: dict[str, float] = {}
    for objective, weight_key in NORMALIZERS.items():
        if f"{objective}_loss_sum" not in sums:
            continue
        weight = max(float(sums[weight_key]), EPS)
        out[f"{objective}_loss"] = float(sums[f"{objective}_loss_sum"]) / weight
        out[f"{objective}_accuracy"] = float(sums[f"{objective}_correct"]) / weight
    if "mlm_loss" in out:
        # math.exp raises OverflowError past ~709; infinity is the honest value there.
        loss = out["mlm_loss"]
        out["mlm_perplexity"] = math.exp(loss) if loss < 709.0 else math.inf
    return out


@dataclasses.dataclass(frozen=True)
class Objective:
    """What the generic train/eval steps need to know of a task's loss.

    `metric_sums(outputs, batch)` -> sums (losses, correct counts, weights);
    `batch_normalizers(batch)` -> the whole batch's weights; `loss_from_sums(sums, normalizers)`
    -> the scalar loss. Fine-tuning tasks supply their own; pretraining uses the ones above.
    """

    metric_sums: Callable[[Mapping, Mapping], dict]
    batch_normalizers: Callable[[Mapping], dict]
    loss_from_sums: Callable[..., jax.Array]
    summarize: Callable[[Mapping[str, float]], dict]


PRETRAINING = Objective(metric_sums, batch_normalizers, loss_from_sums, summarize)
