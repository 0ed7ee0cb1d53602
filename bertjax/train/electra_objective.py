"""ELECTRA's loss, MLM(generator) + lambda * RTD(discriminator), kept as sums and weights.

MLM is the generator's cross-entropy at the masked positions (`objectives`' own sums, so its
`mlm_*` metrics read as the generator's). RTD is the discriminator's sigmoid cross-entropy over
every real (non-padding) token, averaged over them as the paper does. Besides its loss and
accuracy, replaced token detection reports precision and recall on the replaced tokens, from two
more additive pairs: `rtd_replaced_*` (correct: replaced tokens flagged, weight: replaced
tokens) and `rtd_flagged_*` (correct: the same, weight: tokens flagged).
"""

from __future__ import annotations

from typing import Mapping

import jax
import jax.numpy as jnp
import optax

from bertjax.train import objectives
from bertjax.train.objectives import EPS, StepObjective
from bertjax.train.step_metrics import CORRECT, LOSS_SUM, WEIGHT, additive, name

MLM_WEIGHT, RTD_WEIGHT = name("mlm", WEIGHT), name("rtd", WEIGHT)


def metric_sums(outputs: Mapping[str, jax.Array], batch: Mapping) -> dict[str, jax.Array]:
    sums = objectives.metric_sums({"mlm_logits": outputs["mlm_logits"]}, batch)
    real = batch["input_mask"].astype(jnp.float32)
    labels = outputs["rtd_labels"].astype(jnp.float32)
    logits = outputs["rtd_logits"].astype(jnp.float32)
    nll = optax.sigmoid_binary_cross_entropy(logits, labels)
    flagged = (logits > 0).astype(jnp.float32) * real
    caught = jnp.sum(flagged * labels)
    sums.update(additive("rtd", loss_sum=jnp.sum(real * nll),
                         correct=jnp.sum(real * (flagged == labels)), weight=jnp.sum(real)))
    sums.update(additive("rtd_replaced", loss_sum=None, correct=caught,
                         weight=jnp.sum(real * labels)))
    sums.update(additive("rtd_flagged", loss_sum=None, correct=caught, weight=jnp.sum(flagged)))
    return sums


def batch_normalizers(batch: Mapping) -> dict[str, jax.Array]:
    return {MLM_WEIGHT: jnp.sum(batch["masked_weights"].astype(jnp.float32)),
            RTD_WEIGHT: jnp.sum(batch["input_mask"].astype(jnp.float32))}


def loss_function(discriminator_weight: float):
    def loss_from_sums(sums: Mapping[str, jax.Array],
                       normalizers: Mapping[str, jax.Array] | None = None) -> jax.Array:
        """See objectives.loss_from_sums: `normalizers` are the whole batch's weights."""
        normalizers = sums if normalizers is None else normalizers
        mlm = sums[name("mlm", LOSS_SUM)] / jnp.maximum(normalizers[MLM_WEIGHT], EPS)
        rtd = sums[name("rtd", LOSS_SUM)] / jnp.maximum(normalizers[RTD_WEIGHT], EPS)
        return mlm + discriminator_weight * rtd

    return loss_from_sums


def summarize(sums: Mapping[str, float]) -> dict[str, float]:
    """The generator's mlm_* figures, then rtd_loss, rtd_accuracy, rtd_precision, rtd_recall
    and replaced_fraction (of real tokens, what the discriminator saw replaced)."""
    out = objectives.summarize({k: v for k, v in sums.items() if k.startswith("mlm_")})
    ratio = lambda top, bottom: float(sums[top]) / max(float(sums[bottom]), EPS)  # noqa: E731
    out["rtd_loss"] = ratio(name("rtd", LOSS_SUM), RTD_WEIGHT)
    out["rtd_accuracy"] = ratio(name("rtd", CORRECT), RTD_WEIGHT)
    out["rtd_precision"] = ratio(name("rtd_flagged", CORRECT), name("rtd_flagged", WEIGHT))
    out["rtd_recall"] = ratio(name("rtd_replaced", CORRECT), name("rtd_replaced", WEIGHT))
    out["replaced_fraction"] = ratio(name("rtd_replaced", WEIGHT), RTD_WEIGHT)
    return out


def electra_objective(discriminator_weight: float) -> StepObjective:
    return StepObjective(metric_sums, batch_normalizers, loss_function(discriminator_weight),
                         summarize)
