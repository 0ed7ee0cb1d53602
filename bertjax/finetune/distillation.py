"""Knowledge distillation (Hinton et al., 2015) as a fine-tuning objective: `distill.teacher`.

    loss = alpha * T^2 * KL(softmax(teacher / T) || softmax(student / T)) + (1 - alpha) * CE

per example (classification, pairs included) or per labelled token (token classification: the
positions of `label_mask`), averaged like the plain objective (examples, or labelled tokens).
T^2 keeps the soft term's gradients on the scale of the hard one's as T grows.

The teacher's logits are read from the batch (`teacher_logits`, cached once per training row
before training, see bertjax.jobs.distill): the teacher runs without dropout, so its logits for a
row never change and computing them at every step would cost a teacher forward pass per step and
its parameters on the device for nothing. They are a plain feature array, so batching, resuming,
accumulation and sharding treat them like the labels.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import jax
import jax.numpy as jnp

from bertjax.core.errors import UserError
from bertjax.finetune import objectives, schema
from bertjax.finetune.schema import TEACHER_LOGITS
from bertjax.train.objectives import StepObjective
from bertjax.train.step_metrics import LOSS_SUM, additive, name

# The tasks a teacher's logits can be distilled from: the head's output is one distribution per
# example or per token. (Regression has no distribution; QA's two softmaxes over a window's
# positions would need per-window alignment of teacher and student rows.)
TASKS = ("finetune_classification", "finetune_token_classification")
KL, CE = name("distill_kl", LOSS_SUM), name("distill_ce", LOSS_SUM)


@dataclasses.dataclass(frozen=True)
class DistillSettings:
    """The config's `distill` section (configs/distill.py gives its defaults), read and checked
    against the task by bertjax.settings.distill."""

    teacher: str  # a fine-tuned run (workdir or params export)
    alpha: float  # weight of the soft (teacher) term
    temperature: float
    student_layers: int  # K > 0: the student is the teacher's embeddings and first K layers

    def __post_init__(self):
        if not 0.0 <= self.alpha <= 1.0:
            raise UserError(f"distill.alpha must be in [0, 1], got {self.alpha}")
        if not self.temperature > 0.0:
            raise UserError(f"distill.temperature must be positive, got {self.temperature}")
        if self.student_layers < 0:
            raise UserError(f"distill.student_layers must not be negative, got "
                            f"{self.student_layers}")


def kl_divergence(teacher_logits: jax.Array, student_logits: jax.Array) -> jax.Array:
    """KL(softmax(teacher) || softmax(student)) over the last axis, in fp32."""
    log_p = jax.nn.log_softmax(teacher_logits.astype(jnp.float32), axis=-1)
    log_q = jax.nn.log_softmax(student_logits.astype(jnp.float32), axis=-1)
    return jnp.sum(jnp.exp(log_p) * (log_p - log_q), axis=-1)


def objective(base: StepObjective, *, tagging: bool, alpha: float,
              temperature: float) -> StepObjective:
    """`base` (the task's plain objective: its normalizers, loss and summary) with the distilled
    per-position loss. The KL and cross-entropy terms are also summed on their own for the log."""
    t = float(temperature)

    def metric_sums(outputs: Mapping, batch: Mapping) -> dict:
        student = outputs["logits"].astype(jnp.float32)
        teacher = batch[TEACHER_LOGITS].astype(jnp.float32)
        labels = batch["label_ids"] if tagging else batch["label"]
        weights = (objectives._token_weights(batch) if tagging
                   else batch["weight"].astype(jnp.float32))
        kl = kl_divergence(teacher / t, student / t)
        nll, correct = objectives._nll_and_correct(student, labels)
        loss = alpha * t * t * kl + (1.0 - alpha) * nll
        sums = objectives._weighted(loss, weights, correct)
        sums.update(additive("distill_kl", loss_sum=jnp.sum(weights * kl)))
        sums.update(additive("distill_ce", loss_sum=jnp.sum(weights * nll)))
        return sums

    def summarize(sums: Mapping[str, float]) -> dict:
        out = base.summarize(sums)
        weight = max(float(sums.get(objectives.WEIGHT_KEY, 0.0)), objectives.EPS)
        for key, shown in ((KL, "kl"), (CE, "cross_entropy")):
            if key in sums:
                out[shown] = float(sums[key]) / weight
        return out

    return StepObjective(metric_sums, base.batch_normalizers, base.loss_from_sums, summarize)


def task_objective(task, settings: DistillSettings | None) -> StepObjective:
    """The task's objective, distilled when the run has a teacher."""
    if settings is None:
        return task.objective
    return objective(task.objective, tagging=task.kind == "tagged", alpha=settings.alpha,
                     temperature=settings.temperature)


def with_teacher_logits(task, arrays: Mapping, logits) -> dict:
    """The training rows' arrays with the teacher's logits beside them, checked against the
    task's batch and the teacher's field (`finetune.schema`)."""
    teacher = schema.TOKEN_TEACHER if task.kind == "tagged" else schema.TEACHER
    return schema.conform({**arrays, TEACHER_LOGITS: logits}, {**task.batch, **teacher},
                          task.optional_batch)
