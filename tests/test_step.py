"""The sharded train/eval step on 8 fake CPU devices, against the single-device step."""

import jax
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from bertjax.core.errors import UserError
from bertjax.model.config import preset
from bertjax.model.heads import BertForPretraining
from bertjax.parallel import partitioning
from bertjax.parallel.mesh import make_mesh
from bertjax.train.objectives import pretraining_loss
from bertjax.train.optimizer import OptimizerConfig, make_optimizer, make_schedule
from bertjax.train.state import abstract_train_state, create_train_state, param_count
from bertjax.train.step import make_eval_step, make_train_step

B, L, PRED, V = 8, 32, 8, 512
OPTIMIZER = OptimizerConfig(learning_rate=2e-3, warmup_steps=0, total_steps=100)


def _batch(nsp=True, sbo=False, seed=0):
    rng = np.random.default_rng(seed)
    lengths = rng.integers(L // 2, L + 1, B)
    input_mask = (np.arange(L)[None] < lengths[:, None]).astype(np.int32)
    weights = np.ones((B, PRED), np.float32)
    weights[:, -2:] = 0.0  # padding predictions
    batch = {
        "input_ids": (rng.integers(5, V, (B, L)) * input_mask).astype(np.int32),
        "segment_ids": (np.arange(L)[None] >= lengths[:, None] // 2).astype(np.int32),
        "input_mask": input_mask,
        "masked_positions": rng.integers(1, L // 2, (B, PRED)).astype(np.int32),
        "masked_ids": rng.integers(5, V, (B, PRED)).astype(np.int32),
        "masked_weights": weights,
    }
    if nsp:
        batch["nsp_label"] = rng.integers(0, 2, B).astype(np.int32)
    if sbo:
        batch["span_left"] = np.maximum(batch["masked_positions"] - 1, 0)
        batch["span_right"] = batch["masked_positions"] + 1
        batch["span_offset"] = rng.integers(0, 3, (B, PRED)).astype(np.int32)
    return batch


def _shapes(batch):
    return {key: jax.ShapeDtypeStruct(value.shape, value.dtype) for key, value in batch.items()}


def _copy(state):
    # The step donates its input: tests that reuse a state pass copies.
    return jax.tree.map(lambda x: x.copy(), state)


def _setup(model, batch, mesh, accumulation_steps=(1,)):
    optimizer = make_optimizer(OPTIMIZER)
    state, shardings = create_train_state(model, optimizer, _shapes(batch), mesh, seed=0)
    steps = {a: make_train_step(model, optimizer, mesh, shardings, accumulation_steps=a)
             for a in accumulation_steps}
    return dict(mesh=mesh, state=state, shardings=shardings, steps=steps,
                batch=partitioning.global_batch(batch, mesh))


def _run(setup, count, accumulation_steps=1):
    state, metrics = _copy(setup["state"]), []
    for _ in range(count):
        state, m = setup["steps"][accumulation_steps](state, setup["batch"])
        metrics.append(jax.device_get(m))
    return state, metrics


@pytest.fixture(scope="module")
def bert():
    """MLM + NSP with dropout, unrolled layers: on the (2, 2, 2) mesh and on one device."""
    model = BertForPretraining(preset("tiny", vocab_size=V, max_position_embeddings=64))
    batch = _batch()
    return {"sharded": _setup(model, batch, make_mesh(2, 2, 2)),
            "single": _setup(model, batch, make_mesh(1, 1, 1, devices=jax.devices()[:1])),
            "model": model}


@pytest.fixture(scope="module")
def spanbert():
    """MLM + SBO without dropout, scanned layers, on the (2, 2, 2) mesh; accumulation 1 and 2."""
    config = preset("tiny", vocab_size=V, max_position_embeddings=64, hidden_dropout=0.0,
                    attention_dropout=0.0, scan_layers=True)
    model = BertForPretraining(config, nsp=False, sbo=True, max_span_length=4)
    setup = _setup(model, _batch(nsp=False, sbo=True), make_mesh(2, 2, 2),
                   accumulation_steps=(1, 2))
    setup["model"] = model
    setup["eval_step"] = make_eval_step(model, setup["mesh"], setup["shardings"])
    return setup


def _assert_trees_close(got, want, rtol=1e-5, atol=1e-6):
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b),
                                                         rtol=rtol, atol=atol), got, want)


@pytest.mark.slow
def test_sharded_step_matches_single_device_step(bert):
    _assert_trees_close(bert["sharded"]["state"].params, bert["single"]["state"].params, 0, 0)
    sharded, sharded_metrics = _run(bert["sharded"], 3)
    single, single_metrics = _run(bert["single"], 3)
    for got, want in zip(sharded_metrics, single_metrics):
        assert set(got) == set(want) >= {"loss", "grad_norm", "learning_rate", "mlm_loss_sum",
                                         "mlm_correct", "mlm_weight", "nsp_loss_sum",
                                         "nsp_correct", "nsp_count"}
        _assert_trees_close(got, want)
    # Adam divides by sqrt(v): an entry whose gradient is a near-cancelling sum (summed in another
    # order on another mesh) moves by lr * O(relative rounding), so compare at lr-scaled atol.
    _assert_trees_close(sharded.params, single.params, atol=1e-5)
    _assert_trees_close(sharded.opt_state, single.opt_state, atol=1e-6)
    assert int(sharded.step) == 3
    schedule = make_schedule(OPTIMIZER)
    assert [float(m["learning_rate"]) for m in sharded_metrics] == pytest.approx(
        [float(schedule(i)) for i in range(3)])
    assert sharded_metrics[0]["mlm_weight"] == B * (PRED - 2)
    assert sharded_metrics[0]["grad_norm"] > 0


@pytest.mark.slow
def test_parameters_are_sharded_as_the_rules_say(bert, spanbert):
    params = bert["sharded"]["state"].params
    word = params["encoder"]["embeddings"]["word_embeddings"]
    assert word.sharding.spec == P("tensor", "fsdp")
    assert word.addressable_shards[0].data.shape == (V // 2, 128 // 2)
    assert params["encoder"]["layer_0"]["intermediate"]["kernel"].sharding.spec == P(
        "fsdp", "tensor")
    assert params["encoder"]["layer_0"]["attention"]["query"]["kernel"].sharding.spec == P(
        "fsdp", "tensor", None)
    assert params["encoder"]["layer_0"]["attention_norm"]["scale"].sharding.spec == P(None)
    # Adam's moments live where their parameters do; counters are replicated.
    mu = bert["sharded"]["shardings"].opt_state[1].mu
    assert mu["encoder"]["embeddings"]["word_embeddings"].spec == P("tensor", "fsdp")
    assert bert["sharded"]["state"].opt_state[1].mu["encoder"]["layer_0"]["intermediate"][
        "kernel"].sharding.spec == P("fsdp", "tensor")
    assert bert["sharded"]["state"].step.sharding.spec == P()
    # Scanned layers carry a leading, unsharded "layers" axis.
    scanned = spanbert["state"].params["encoder"]["layers"]["intermediate"]["kernel"]
    assert scanned.shape == (2, 128, 512) and scanned.sharding.spec == P(None, "fsdp", "tensor")


@pytest.mark.slow
def test_abstract_state_matches_the_created_one(bert):
    sharded = bert["sharded"]
    optimizer = make_optimizer(OPTIMIZER)
    abstract, shardings = abstract_train_state(bert["model"], optimizer, _shapes(_batch()),
                                               sharded["mesh"])
    assert jax.tree.structure(abstract) == jax.tree.structure(sharded["state"])

    def same(spec, leaf):
        assert spec.shape == leaf.shape and spec.dtype == leaf.dtype
        assert spec.sharding.is_equivalent_to(leaf.sharding, leaf.ndim)

    jax.tree.map(same, abstract, sharded["state"])
    # tiny: 2 layers of 128, intermediate 512, 64 positions, vocab 512, MLM + NSP heads.
    assert param_count(sharded["state"].params) == 504_834


@pytest.mark.slow
def test_step_donates_the_old_state(bert):
    setup = bert["sharded"]
    state = _copy(setup["state"])
    new_state, _ = setup["steps"][1](state, setup["batch"])
    assert all(leaf.is_deleted() for leaf in jax.tree.leaves(state))
    assert not any(leaf.is_deleted() for leaf in jax.tree.leaves(new_state))


@pytest.mark.slow
def test_step_is_a_pure_function_of_state_and_batch(bert):
    setup = bert["sharded"]
    first = setup["steps"][1](_copy(setup["state"]), setup["batch"])
    second = setup["steps"][1](_copy(setup["state"]), setup["batch"])
    _assert_trees_close(jax.device_get(first), jax.device_get(second), rtol=0, atol=0)
    # ... and dropout really is on: a different step number draws a different mask.
    later = setup["state"].replace(step=setup["state"].step + 1)
    shifted = setup["steps"][1](_copy(later), setup["batch"])
    assert float(shifted[1]["mlm_loss_sum"]) != float(first[1]["mlm_loss_sum"])


def test_loss_decreases_on_a_fixed_batch(bert):
    _, metrics = _run(bert["sharded"], 20)
    losses = [float(m["loss"]) for m in metrics]
    assert np.all(np.isfinite(losses))
    assert np.mean(losses[-3:]) < 0.7 * np.mean(losses[:3]), losses


@pytest.mark.slow
def test_accumulation_equals_one_big_step(spanbert):
    whole, whole_metrics = _run(spanbert, 2, accumulation_steps=1)
    split, split_metrics = _run(spanbert, 2, accumulation_steps=2)
    for got, want in zip(split_metrics, whole_metrics):
        assert set(got) == set(want) >= {"sbo_loss_sum", "sbo_correct", "sbo_weight"}
        _assert_trees_close(got, want)
    _assert_trees_close(split.params, whole.params)


@pytest.mark.slow
def test_eval_step_matches_the_train_forward_pass(spanbert):
    state = spanbert["state"]
    sums = jax.device_get(spanbert["eval_step"](state.params, spanbert["batch"]))
    _, train_metrics = _run(spanbert, 1)
    assert set(sums) == {"mlm_loss_sum", "mlm_correct", "mlm_weight",
                         "sbo_loss_sum", "sbo_correct", "sbo_weight"}
    _assert_trees_close(sums, {key: train_metrics[0][key] for key in sums})
    # ... and both agree with an unsharded, unjitted forward pass and the loss.
    host_params = jax.device_get(state.params)
    batch = _batch(nsp=False, sbo=True)
    outputs = spanbert["model"].apply({"params": host_params}, batch, deterministic=True)
    loss, want = pretraining_loss(outputs, batch)
    _assert_trees_close(sums, jax.device_get(want), rtol=2e-5)
    assert float(train_metrics[0]["loss"]) == pytest.approx(float(loss), rel=2e-5)


def test_bad_accumulation_is_a_user_error(spanbert):
    optimizer = make_optimizer(OPTIMIZER)
    with pytest.raises(UserError, match="accumulation_steps"):
        make_train_step(spanbert["model"], optimizer, spanbert["mesh"], spanbert["shardings"],
                        accumulation_steps=0)
    step = make_train_step(spanbert["model"], optimizer, spanbert["mesh"],
                           spanbert["shardings"], accumulation_steps=3)
    with pytest.raises(UserError, match="batch size 8"):
        step(_copy(spanbert["state"]), spanbert["batch"])
