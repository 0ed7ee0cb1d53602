"""The fine-tuning losses as `StepObjective`s for the generic train step (bertjax.train.step).

Each keeps sums and a weight (`task_loss_sum`, `task_correct`, `task_weight`), so micro-batches,
devices and log windows add up exactly; zero-weight rows (batch padding) count nowhere. Packed
sentence rows (bertjax.finetune.packing) have a label and a weight per sequence slot, [B, S]: the
classification and regression sums run over slots as over rows, so the loss is the same mean.

    classification  mean cross-entropy over examples
    regression      mean squared error over examples
    tagging         mean cross-entropy over tagged positions (label_mask)
    tagging + CRF   mean negative log-likelihood of the tag sequence, over examples
    spans           mean of the start and end cross-entropies over examples (context only)
    span scores     mean cross-entropy of the answer among all candidate spans (QA span scorer)
    in-batch        retrieval: mean cross-entropy of each query's positive among the batch's
                    documents (every positive, then every hard negative), scored by cosine /
                    temperature; a document with the same text as the query's positive
                    (`document_key`) is not one of its negatives, nor is a padding row
"""

from __future__ import annotations

import functools
from typing import Mapping

import jax
import jax.numpy as jnp

from bertjax.model import crf
from bertjax.train.objectives import StepObjective
from bertjax.train.step_metrics import CORRECT, LOSS_SUM, WEIGHT, additive, name

EPS = 1e-8
TASK = "task"
LOSS_KEY, WEIGHT_KEY, CORRECT_KEY = name(TASK, LOSS_SUM), name(TASK, WEIGHT), name(TASK, CORRECT)


def _nll_and_correct(logits: jax.Array, labels: jax.Array) -> tuple[jax.Array, jax.Array]:
    logits = logits.astype(jnp.float32)
    log_probs = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(log_probs, labels[..., None].astype(jnp.int32), axis=-1)[..., 0]
    return nll, (jnp.argmax(logits, axis=-1) == labels).astype(jnp.float32)


def _weighted(loss: jax.Array, weight: jax.Array, correct: jax.Array | None = None) -> dict:
    return additive(TASK, loss_sum=jnp.sum(weight * loss), weight=jnp.sum(weight),
                    correct=None if correct is None else jnp.sum(weight * correct))


def _example_weights(batch: Mapping) -> dict:
    return {WEIGHT_KEY: jnp.sum(batch["weight"].astype(jnp.float32))}


def _token_weights(batch: Mapping) -> jax.Array:
    return batch["label_mask"].astype(jnp.float32) * batch["weight"].astype(jnp.float32)[:, None]


def loss_from_sums(sums: Mapping, normalizers: Mapping | None = None) -> jax.Array:
    normalizers = sums if normalizers is None else normalizers
    return sums[LOSS_KEY] / jnp.maximum(normalizers[WEIGHT_KEY], EPS)


def summarize(sums: Mapping[str, float]) -> dict[str, float]:
    weight = max(float(sums.get(WEIGHT_KEY, 0.0)), EPS)
    out = {"task_loss": float(sums.get(LOSS_KEY, 0.0)) / weight}
    if CORRECT_KEY in sums:
        out["accuracy"] = float(sums[CORRECT_KEY]) / weight
    return out


def classification_sums(outputs: Mapping, batch: Mapping) -> dict:
    nll, correct = _nll_and_correct(outputs["logits"], batch["label"])
    return _weighted(nll, batch["weight"].astype(jnp.float32), correct)


def regression_sums(outputs: Mapping, batch: Mapping) -> dict:
    # [..., 0]: scores [B], or [B, S] for packed rows.
    error = outputs["logits"][..., 0].astype(jnp.float32) - batch["label"].astype(jnp.float32)
    return _weighted(error * error, batch["weight"].astype(jnp.float32))


def tagging_sums(outputs: Mapping, batch: Mapping) -> dict:
    nll, correct = _nll_and_correct(outputs["logits"], batch["label_ids"])
    return _weighted(nll, _token_weights(batch), correct)


def tagging_normalizers(batch: Mapping) -> dict:
    return {WEIGHT_KEY: jnp.sum(_token_weights(batch))}


def crf_sums(outputs: Mapping, batch: Mapping) -> dict:
    p = outputs["crf"]
    log_likelihood = crf.log_likelihood(outputs["logits"], batch["label_ids"],
                                        batch["label_mask"], p["transitions"],
                                        p["start_transitions"], p["end_transitions"])
    return _weighted(-log_likelihood, batch["weight"].astype(jnp.float32))


def span_sums(outputs: Mapping, batch: Mapping) -> dict:
    start_nll, start_ok = _nll_and_correct(outputs["start_logits"], batch["start_positions"])
    end_nll, end_ok = _nll_and_correct(outputs["end_logits"], batch["end_positions"])
    return _weighted((start_nll + end_nll) / 2, batch["weight"].astype(jnp.float32),
                     start_ok * end_ok)


def span_score_sums(outputs: Mapping, batch: Mapping) -> dict:
    """QA's span scorer: one softmax over every (start, length) cell of `span_scores` [B, L, K]
    (cells off the context hold MASKED_LOGIT); rows whose answer is longer than K have weight 0
    (the task's features), their clipped target is never counted."""
    scores = outputs["span_scores"]
    rows, length, k = scores.shape
    start = batch["start_positions"].astype(jnp.int32)
    width = jnp.clip(batch["end_positions"].astype(jnp.int32) - start, 0, k - 1)
    nll, correct = _nll_and_correct(scores.reshape(rows, length * k), start * k + width)
    return _weighted(nll, batch["weight"].astype(jnp.float32), correct)


def in_batch_sums(outputs: Mapping, batch: Mapping, temperature: float) -> dict:
    queries = outputs["query"].astype(jnp.float32)
    weight = batch["weight"].astype(jnp.float32)
    documents, keys, real = [outputs["document"]], [batch["document_key"]], [weight > 0]
    if "negative" in outputs:
        documents.append(outputs["negative"])
        keys.append(batch["negative_key"])
        real.append(weight > 0)
    documents = jnp.concatenate(documents).astype(jnp.float32)  # [D, H], positives first
    keys, real = jnp.concatenate(keys), jnp.concatenate(real)
    target = jnp.arange(queries.shape[0])
    own = jnp.arange(documents.shape[0])[None, :] == target[:, None]  # [B, D]
    same_text = keys[None, :] == batch["document_key"][:, None]
    candidate = own | (real[None, :] & ~same_text)
    scores = queries @ documents.T / temperature
    nll, correct = _nll_and_correct(jnp.where(candidate, scores, -1e9), target)
    return _weighted(nll, weight, correct)


def in_batch(temperature: float) -> StepObjective:
    return StepObjective(functools.partial(in_batch_sums, temperature=temperature),
                         _example_weights, loss_from_sums, summarize)


CLASSIFICATION = StepObjective(classification_sums, _example_weights, loss_from_sums, summarize)
REGRESSION = StepObjective(regression_sums, _example_weights, loss_from_sums, summarize)
TAGGING = StepObjective(tagging_sums, tagging_normalizers, loss_from_sums, summarize)
CRF_TAGGING = StepObjective(crf_sums, _example_weights, loss_from_sums, summarize)
SPANS = StepObjective(span_sums, _example_weights, loss_from_sums, summarize)
SPAN_SCORES = StepObjective(span_score_sums, _example_weights, loss_from_sums, summarize)
