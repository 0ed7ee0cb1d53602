"""Pretraining losses and metric sums against a numpy reference."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.train import step_metrics
from bertjax.train.logging_hook import window_summary
from bertjax.train.objectives import loss_from_sums, pretraining_loss, summarize

B, P, V = 6, 5, 11


def _example(nsp=True, sbo=False, seed=0):
    rng = np.random.default_rng(seed)
    weights = (rng.random((B, P)) < 0.7).astype(np.float32)
    weights[0] = 0.0  # an example with no predictions at all
    batch = {"masked_ids": rng.integers(0, V, (B, P)).astype(np.int32),
             "masked_weights": weights}
    outputs = {"mlm_logits": rng.normal(size=(B, P, V)).astype(np.float32) * 3}
    # Make some predictions right so accuracy is not trivially 0.
    outputs["mlm_logits"][1, :, :] = -5.0
    outputs["mlm_logits"][1, np.arange(P), batch["masked_ids"][1]] = 5.0
    if nsp:
        batch["nsp_label"] = rng.integers(0, 2, (B,)).astype(np.int32)
        outputs["nsp_logits"] = rng.normal(size=(B, 2)).astype(np.float32)
    if sbo:
        outputs["sbo_logits"] = rng.normal(size=(B, P, V)).astype(np.float32)
    return outputs, batch


def _reference_ce(logits, labels):
    logits = logits.astype(np.float64)
    shifted = logits - logits.max(-1, keepdims=True)
    log_probs = shifted - np.log(np.exp(shifted).sum(-1, keepdims=True))
    nll = -np.take_along_axis(log_probs, labels[..., None], -1)[..., 0]
    return nll, (logits.argmax(-1) == labels)


def test_bert_loss_matches_numpy_reference():
    outputs, batch = _example()
    loss, sums = jax.jit(pretraining_loss)(outputs, batch)
    w = batch["masked_weights"]
    nll, correct = _reference_ce(outputs["mlm_logits"], batch["masked_ids"])
    mlm = (w * nll).sum() / w.sum()
    nsp_nll, nsp_correct = _reference_ce(outputs["nsp_logits"], batch["nsp_label"])
    assert float(loss) == pytest.approx(mlm + nsp_nll.mean(), rel=1e-5)
    assert float(sums["mlm_loss_sum"]) == pytest.approx((w * nll).sum(), rel=1e-5)
    assert float(sums["mlm_correct"]) == pytest.approx((w * correct).sum())
    assert float(sums["mlm_correct"]) >= w[1].sum() > 0
    assert float(sums["mlm_weight"]) == pytest.approx(w.sum())
    assert float(sums["nsp_loss_sum"]) == pytest.approx(nsp_nll.sum(), rel=1e-5)
    assert float(sums["nsp_correct"]) == nsp_correct.sum()
    assert float(sums["nsp_count"]) == B
    assert set(sums) == {"mlm_loss_sum", "mlm_correct", "mlm_weight",
                         "nsp_loss_sum", "nsp_correct", "nsp_count"}
    metrics = summarize(jax.device_get(sums))
    assert metrics["mlm_loss"] == pytest.approx(mlm, rel=1e-5)
    assert metrics["mlm_accuracy"] == pytest.approx((w * correct).sum() / w.sum())
    assert metrics["mlm_perplexity"] == pytest.approx(math.exp(mlm), rel=1e-5)
    assert metrics["nsp_loss"] == pytest.approx(nsp_nll.mean(), rel=1e-5)
    assert metrics["nsp_accuracy"] == pytest.approx(nsp_correct.mean())


def test_sbo_uses_mlm_targets_and_weights_and_nsp_is_optional():
    outputs, batch = _example(nsp=False, sbo=True)
    loss, sums = pretraining_loss(outputs, batch)
    w = batch["masked_weights"]
    mlm_nll, _ = _reference_ce(outputs["mlm_logits"], batch["masked_ids"])
    sbo_nll, sbo_correct = _reference_ce(outputs["sbo_logits"], batch["masked_ids"])
    want = (w * mlm_nll).sum() / w.sum() + (w * sbo_nll).sum() / w.sum()
    assert float(loss) == pytest.approx(want, rel=1e-5)
    assert not any(key.startswith("nsp") for key in sums)
    metrics = summarize(jax.device_get(sums))
    assert metrics["sbo_loss"] == pytest.approx((w * sbo_nll).sum() / w.sum(), rel=1e-5)
    assert metrics["sbo_accuracy"] == pytest.approx((w * sbo_correct).sum() / w.sum())
    assert "nsp_loss" not in metrics


def test_padding_predictions_are_ignored():
    outputs, batch = _example()
    loss, sums = pretraining_loss(outputs, batch)
    # Garbage logits and labels at weight-0 slots change nothing.
    pad = batch["masked_weights"] == 0
    outputs["mlm_logits"] = np.where(pad[..., None], 1e4, outputs["mlm_logits"])
    batch["masked_ids"] = np.where(pad, V - 1, batch["masked_ids"]).astype(np.int32)
    loss2, sums2 = pretraining_loss(outputs, batch)
    assert float(loss2) == pytest.approx(float(loss), rel=1e-6)
    for key in sums:
        assert float(sums2[key]) == pytest.approx(float(sums[key]), rel=1e-6)


def test_all_padding_gives_zero_mlm_loss_not_nan():
    outputs, batch = _example(nsp=False)
    batch["masked_weights"] = np.zeros_like(batch["masked_weights"])
    loss, sums = pretraining_loss(outputs, batch)
    assert float(loss) == 0.0 and float(sums["mlm_weight"]) == 0.0


def test_bf16_logits_are_scored_in_fp32():
    outputs, batch = _example()
    bf16 = {k: jnp.asarray(v, jnp.bfloat16) for k, v in outputs.items()}
    loss, _ = pretraining_loss(bf16, batch)
    assert loss.dtype == jnp.float32


def test_sums_of_two_halves_equal_the_whole_batch():
    outputs, batch = _example(sbo=True)
    loss, whole = pretraining_loss(outputs, batch)
    halves = [pretraining_loss({k: v[s] for k, v in outputs.items()},
                               {k: v[s] for k, v in batch.items()})[1]
              for s in (slice(0, B // 2), slice(B // 2, B))]
    added = {k: halves[0][k] + halves[1][k] for k in whole}
    for key in whole:
        assert float(added[key]) == pytest.approx(float(whole[key]), rel=1e-5)
    assert summarize(jax.device_get(added)) == pytest.approx(summarize(jax.device_get(whole)),
                                                             rel=1e-5)
    # Dividing each half by the whole batch's weights makes the half losses add up exactly.
    parts = [loss_from_sums(half, whole) for half in halves]
    assert float(parts[0] + parts[1]) == pytest.approx(float(loss), rel=1e-5)


def test_a_logging_window_adds_sums_averages_the_rest_and_keeps_the_last_learning_rate():
    steps = [{"mlm_loss_sum": 6.0, "mlm_correct": 1.0, "mlm_weight": 2.0, "loss": 3.0,
              "grad_norm": 1.0, "learning_rate": 1e-4},
             {"mlm_loss_sum": 2.0, "mlm_correct": 3.0, "mlm_weight": 6.0, "loss": 1.0 / 3,
              "grad_norm": 3.0, "learning_rate": 2e-4}]
    record = window_summary(steps, summarize)
    assert record["mlm_loss"] == pytest.approx(8.0 / 8.0)  # not the mean of 3.0 and 1/3
    assert record["mlm_accuracy"] == pytest.approx(4.0 / 8.0)
    assert record["loss"] == pytest.approx(5.0 / 3) and record["grad_norm"] == 2.0
    assert record["learning_rate"] == 2e-4
    assert "mlm_loss_sum" not in record


def test_sum_names_follow_the_contract():
    sums = step_metrics.additive("nsp", loss_sum=1.0, count=2.0)
    assert sums == {"nsp_loss_sum": 1.0, "nsp_count": 2.0}
    assert all(step_metrics.kind_of(k) is step_metrics.Kind.SUM for k in sums)
    with pytest.raises(ValueError, match="not a kind of sum"):
        step_metrics.name("nsp", "total")
