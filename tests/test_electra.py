"""ELECTRA's objective and model on hand-built batches: the loss and metrics against a numpy
reference, replaced labels (a sample equal to the original token is original), the discriminator
reading the generator's samples, Gumbel sampling's law and determinism, and bad configs refused
with one line and exit 2 before anything is written."""

import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.cli import main
from bertjax.model.config import preset
from bertjax.model.electra import (DiscriminatorHead, ElectraForPretraining, gumbel_sample,
                                   replace_masked)
from bertjax.model.encoder import Encoder
from bertjax.train.electra_objective import electra_objective
from pretrain_runs import tiny_args

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
V = 11
# Compiling, not running, dominates these tiny steps.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}


def hand_batch():
    """Two rows of 6 tokens (the second padded after 4), three prediction slots, one unused."""
    return {
        "input_ids": np.array([[2, 4, 3, 5, 6, 3], [2, 7, 4, 3, 0, 0]], np.int32),
        "segment_ids": np.zeros((2, 6), np.int32),
        "input_mask": np.array([[1] * 6, [1, 1, 1, 1, 0, 0]], np.int32),
        "masked_positions": np.array([[1, 3, 4], [2, 0, 0]], np.int32),
        "masked_ids": np.array([[8, 9, 10], [5, 0, 0]], np.int32),
        "masked_weights": np.array([[1, 1, 1], [1, 0, 0]], np.float32),
    }


def test_objective_matches_a_numpy_reference():
    batch = hand_batch()
    rng = np.random.default_rng(0)
    outputs = {"mlm_logits": rng.normal(size=(2, 3, V)).astype(np.float32),
               "rtd_logits": rng.normal(size=(2, 6)).astype(np.float32) * 3,
               "rtd_labels": np.array([[0, 1, 0, 1, 0, 0], [0, 0, 1, 0, 0, 1]], np.int32)}
    objective = electra_objective(50.0)
    sums = jax.device_get(objective.metric_sums(outputs, batch))
    loss = float(objective.loss_from_sums(sums))
    summary = objective.summarize(sums)

    logp = outputs["mlm_logits"] - np.log(np.exp(outputs["mlm_logits"]).sum(-1, keepdims=True))
    nll = -np.take_along_axis(logp, batch["masked_ids"][..., None], -1)[..., 0]
    w = batch["masked_weights"]
    mlm = (nll * w).sum() / w.sum()
    mlm_acc = ((outputs["mlm_logits"].argmax(-1) == batch["masked_ids"]) * w).sum() / w.sum()
    real = batch["input_mask"].astype(bool)
    z, y = outputs["rtd_logits"][real].astype(np.float64), outputs["rtd_labels"][real]
    bce = np.mean(np.log1p(np.exp(-np.abs(z))) + np.maximum(z, 0) - z * y)
    flagged = z > 0
    # The padded position labelled 1 (row 1, last) must not count anywhere.
    assert y.sum() == 3 and outputs["rtd_labels"].sum() == 4
    np.testing.assert_allclose(loss, mlm + 50.0 * bce, rtol=1e-5)
    np.testing.assert_allclose(summary["mlm_loss"], mlm, rtol=1e-5)
    np.testing.assert_allclose(summary["mlm_accuracy"], mlm_acc, rtol=1e-6)
    np.testing.assert_allclose(summary["rtd_loss"], bce, rtol=1e-5)
    np.testing.assert_allclose(summary["rtd_accuracy"], np.mean(flagged == y), rtol=1e-6)
    tp = np.sum(flagged & (y == 1))
    np.testing.assert_allclose(summary["rtd_precision"], tp / max(flagged.sum(), 1), rtol=1e-6)
    np.testing.assert_allclose(summary["rtd_recall"], tp / y.sum(), rtol=1e-6)
    np.testing.assert_allclose(summary["replaced_fraction"], y.sum() / real.sum(), rtol=1e-6)

    # Micro-batches dividing by the whole batch's weights add up to the whole-batch loss.
    halves = [{k: v[i:i + 1] for k, v in batch.items()} for i in range(2)]
    outs = [{k: v[i:i + 1] for k, v in outputs.items()} for i in range(2)]
    norm = objective.batch_normalizers(batch)
    parts = sum(float(objective.loss_from_sums(objective.metric_sums(o, b), norm))
                for o, b in zip(outs, halves))
    np.testing.assert_allclose(parts, loss, rtol=1e-5)


def test_a_sample_equal_to_the_original_is_labelled_original():
    batch = hand_batch()
    # Slot 0 of row 0 samples its original (8), slot 1 another token, slot 2 its original;
    # row 1's unused slots sample tokens that must be ignored.
    sampled = np.array([[8, 1, 10], [5, 9, 9]], np.int32)
    corrupted, replaced = jax.device_get(replace_masked(
        batch["input_ids"], batch["masked_positions"], batch["masked_weights"],
        batch["masked_ids"], sampled))
    np.testing.assert_array_equal(corrupted, [[2, 8, 3, 1, 10, 3], [2, 7, 5, 3, 0, 0]])
    np.testing.assert_array_equal(replaced, [[0, 0, 0, 1, 0, 0], [0, 0, 0, 0, 0, 0]])


def tiny_models(generator_hidden=16, scan=True):
    disc = preset("tiny", vocab_size=V, hidden_size=32, num_heads=2, intermediate_size=64,
                  max_position_embeddings=16, hidden_dropout=0.0, attention_dropout=0.0,
                  scan_layers=scan)
    return disc, disc.replace(hidden_size=generator_hidden, num_heads=1, intermediate_size=40)


@pytest.mark.slow
def test_the_discriminator_reads_the_generators_samples():
    disc, gen = tiny_models()
    model = ElectraForPretraining(disc, gen)
    batch = hand_batch()
    init = jax.jit(lambda key: model.init({"params": key}, batch))  # eager init is slow
    params = nn.meta.unbox(init(jax.random.PRNGKey(0))["params"])
    # A generator that always samples token 9: slot (0, 1) holds 9 already, so only it stays
    # original; the unused slots write nothing.
    params["generator_head"]["bias"] = jnp.zeros(V).at[9].set(1e4)
    out = jax.jit(lambda p: model.apply({"params": p}, batch, deterministic=False,
                                        rngs={"dropout": jax.random.PRNGKey(3)}))(params)
    np.testing.assert_array_equal(out["sampled_ids"], np.full((2, 3), 9))
    expected_ids = np.array([[2, 9, 3, 9, 9, 3], [2, 7, 9, 3, 0, 0]], np.int32)
    np.testing.assert_array_equal(out["rtd_labels"], [[0, 1, 0, 0, 1, 0], [0, 0, 1, 0, 0, 0]])

    @jax.jit
    def discriminate(p):
        encoded = Encoder(disc).apply({"params": p["encoder"]}, expected_ids,
                                      batch["segment_ids"], batch["input_mask"])
        return DiscriminatorHead(disc).apply({"params": p["discriminator_head"]},
                                             encoded.sequence)

    scores = discriminate(params)
    np.testing.assert_allclose(out["rtd_logits"], scores, atol=1e-6)
    assert out["mlm_logits"].shape == (2, 3, V) and out["mlm_logits"].dtype == jnp.float32


def test_sampling_is_deterministic_per_key_and_follows_the_softmax():
    logits = jnp.log(jnp.array([[0.5, 0.3, 0.15, 0.05]]))
    logits = jnp.broadcast_to(logits, (40_000, 4))
    a = gumbel_sample(logits, jax.random.PRNGKey(1))
    np.testing.assert_array_equal(a, gumbel_sample(logits, jax.random.PRNGKey(1)))
    assert not np.array_equal(a, gumbel_sample(logits, jax.random.PRNGKey(2)))
    freq = np.bincount(np.asarray(a), minlength=4) / a.shape[0]
    np.testing.assert_allclose(freq, [0.5, 0.3, 0.15, 0.05], atol=0.01)
    # No gradient flows through the sample into the generator's logits.
    grad = jax.grad(lambda x: gumbel_sample(x, jax.random.PRNGKey(1)).sum().astype(jnp.float32))(
        jnp.zeros((3, 4)))
    assert not np.any(grad)


def electra_args(workdir, corpus, **overrides):
    args = tiny_args(workdir, corpus, **{"model.preset": "tiny", **overrides})
    args[1] = f"--config={REPO}/configs/electra_small.py"
    return args


@pytest.mark.parametrize("overrides, message", [
    ({"electra.generator_hidden_size": 256}, "larger than the discriminator"),
    ({"electra.generator_num_layers": 3}, "larger than the discriminator"),
    ({"electra.generator_vocab_size": 500}, "share their embeddings"),
    ({"electra.discriminator_weight": 0.0}, "must be positive"),
    ({"electra.discriminator_weight": -50.0}, "must be positive"),
    ({"electra.generator_hidden_size": 48, "electra.generator_num_heads": 5}, "not divisible"),
])
def test_bad_electra_configs_exit_2_with_one_line(tmp_path, capsys, overrides, message):
    workdir = tmp_path / "wd"
    assert main.main(electra_args(str(workdir), str(tmp_path / "no-corpus"), **overrides)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bertjax: error:") and "\n" not in err and message in err, err
    assert not workdir.exists() and not (tmp_path / "no-corpus").exists()


@pytest.mark.slow
@pytest.mark.parametrize("gdes", [False, True], ids=["plain", "gdes"])
def test_a_sharded_step_equals_the_one_device_step(gdes):
    """(data, fsdp, tensor) = (2, 2, 2) against one device, dropout and sampling on: the
    replacement, the one-hot scatter and the RTD sums shard like the rest of the step (and
    GDES's residual word table like the word table)."""
    from bertjax.parallel import partitioning
    from bertjax.parallel.mesh import make_mesh
    from bertjax.train.optimizer import OptimizerConfig, make_optimizer
    from bertjax.train.state import abstract_train_state, create_train_state
    from bertjax.train.step import make_train_step

    disc = preset("tiny", vocab_size=64, max_position_embeddings=16, scan_layers=True)
    model = ElectraForPretraining(disc, disc.replace(hidden_size=32, num_heads=2,
                                                     intermediate_size=64), gdes)
    rng = np.random.default_rng(0)
    batch = {"input_ids": rng.integers(5, 64, (8, 12)).astype(np.int32),
             "segment_ids": np.zeros((8, 12), np.int32),
             "input_mask": (np.arange(12)[None] < rng.integers(6, 13, (8, 1))).astype(np.int32),
             "masked_positions": np.tile(np.array([1, 3, 5], np.int32), (8, 1)),
             "masked_ids": rng.integers(5, 64, (8, 3)).astype(np.int32),
             "masked_weights": np.ones((8, 3), np.float32)}
    shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch.items()}
    optimizer = make_optimizer(OptimizerConfig(total_steps=10, warmup_steps=1,
                                               learning_rate=1e-3))
    objective = electra_objective(50.0)
    results = []
    start = None
    for mesh in (make_mesh(1, 1, 1, devices=jax.devices()[:1]), make_mesh(2, 2, 2)):
        if start is None:
            state, shardings = create_train_state(model, optimizer, shapes, mesh, seed=0)
            start = jax.device_get(state)
        else:
            _, shardings = abstract_train_state(model, optimizer, shapes, mesh, seed=0)
            state = jax.device_put(start, shardings)
        global_batch = partitioning.global_batch(batch, mesh)
        step = make_train_step(model, optimizer, mesh, shardings, objective=objective).lower(
            state, global_batch).compile(compiler_options=FAST_COMPILE)
        metrics = []
        for _ in range(2):
            state, m = step(state, global_batch)
            metrics.append(jax.device_get(m))
        results.append((jax.device_get(state.params), metrics))
    (p1, m1), (p8, m8) = results
    for a, b in zip(m1, m8):
        for key in a:
            np.testing.assert_allclose(a[key], b[key], rtol=1e-5, atol=1e-6, err_msg=key)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-5, atol=1e-6), p1, p8)
    assert m1[0]["rtd_replaced_weight"] > 0
    assert ("word_embeddings_delta" in p8) == gdes
