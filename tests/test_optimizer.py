"""Schedules, BERT's AdamWeightDecayOptimizer and StableAdamW (numpy references), optax equivalence,
decay mask."""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

from bertjax.core.errors import UserError
from bertjax.train.optimizer import (OptimizerConfig, applied_learning_rate, decay_mask,
                                     make_optimizer, make_schedule)
from bertjax.train.stable_adamw import update_scale


def _params():
    rng = np.random.default_rng(0)
    return {
        "embeddings": {"word": {"embedding": rng.normal(size=(6, 4)).astype(np.float32)},
                       "LayerNorm_0": {"scale": np.ones(4, np.float32),
                                       "bias": np.zeros(4, np.float32)}},
        "layer": {"mlp": {"kernel": rng.normal(size=(4, 3)).astype(np.float32),
                          "bias": rng.normal(size=(3,)).astype(np.float32)},
                  "output_norm": {"scale": rng.normal(size=(3,)).astype(np.float32)}},
    }


def _grads(step):
    rng = np.random.default_rng(100 + step)
    return jax.tree.map(lambda p: (rng.normal(size=p.shape) * (step + 1)).astype(np.float32),
                        _params())


def _run(optimizer, steps, grads_fn=_grads, rates=None):
    params = jax.tree.map(jnp.asarray, _params())
    state = optimizer.init(params)
    update = jax.jit(optimizer.update)
    for step in range(steps):
        updates, state = update(jax.tree.map(jnp.asarray, grads_fn(step)), state, params)
        params = optax.apply_updates(params, updates)
        if rates is not None:
            rates.append(float(applied_learning_rate(state)))
    return params


def test_schedule_values_at_key_steps():
    config = OptimizerConfig(learning_rate=1e-3, warmup_steps=100, total_steps=1100,
                             end_learning_rate=1e-5)
    lr = make_schedule(config)
    assert float(lr(0)) == 0.0
    assert float(lr(50)) == pytest.approx(5e-4)
    assert float(lr(100)) == pytest.approx(1e-3)
    assert float(lr(600)) == pytest.approx((1e-3 + 1e-5) / 2)
    assert float(lr(1100)) == pytest.approx(1e-5)
    assert float(lr(5000)) == pytest.approx(1e-5)
    cosine = make_schedule(dataclasses.replace(config, decay="cosine"))
    assert float(cosine(100)) == pytest.approx(1e-3)
    assert float(cosine(600)) == pytest.approx((1e-3 + 1e-5) / 2, rel=1e-5)
    assert float(cosine(1100)) == pytest.approx(1e-5)
    constant = make_schedule(dataclasses.replace(config, decay="constant", warmup_steps=0))
    assert float(constant(0)) == float(constant(999)) == pytest.approx(1e-3)


def _bert_reference(config, steps):
    """google-research/bert optimization.py (AdamWeightDecayOptimizer + clip_by_global_norm)."""
    params = _params()
    m = jax.tree.map(np.zeros_like, params)
    v = jax.tree.map(np.zeros_like, params)
    flat_mask = jax.tree.leaves(decay_mask(params))
    for step in range(steps):
        if step < config.warmup_steps:
            lr = config.learning_rate * step / config.warmup_steps
        else:
            frac = (step - config.warmup_steps) / (config.total_steps - config.warmup_steps)
            lr = config.learning_rate + frac * (config.end_learning_rate - config.learning_rate)
        grads = _grads(step)
        norm = np.sqrt(sum(np.sum(g.astype(np.float64) ** 2) for g in jax.tree.leaves(grads)))
        grads = jax.tree.map(lambda g: g * config.clip_norm / max(norm, config.clip_norm), grads)
        leaves, tree = jax.tree.flatten(params)
        new = []
        for i, (p, g, mi, vi) in enumerate(zip(leaves, jax.tree.leaves(grads),
                                               jax.tree.leaves(m), jax.tree.leaves(v))):
            mi[...] = config.b1 * mi + (1 - config.b1) * g
            vi[...] = config.b2 * vi + (1 - config.b2) * g * g
            update = mi / (np.sqrt(vi) + config.eps)
            if flat_mask[i]:
                update = update + config.weight_decay * p
            new.append(p - lr * update)
        params = jax.tree.unflatten(tree, new)
    return params


def test_adamw_without_bias_correction_matches_bert_numpy_reference():
    config = OptimizerConfig(learning_rate=1e-2, warmup_steps=2, total_steps=10,
                             weight_decay=0.1, eps=1e-6, clip_norm=1.0)
    rates = []
    got = _run(make_optimizer(config), steps=5, rates=rates)
    want = _bert_reference(config, steps=5)
    np.testing.assert_allclose(rates, [0.0, 5e-3, 1e-2, 1e-2 * 7 / 8, 1e-2 * 6 / 8], rtol=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6), got, want)
    # The reference really differs from the bias-corrected optimizer (the test can fail).
    corrected = _run(make_optimizer(dataclasses.replace(config, bias_correction=True)), 5)
    assert not np.allclose(corrected["layer"]["mlp"]["kernel"], want["layer"]["mlp"]["kernel"],
                           rtol=1e-3)


def lamb_of_the_paper(learning_rate, b1, b2, eps, weight_decay, mask):
    """optax.lamb with the trust ratio masked like weight decay (You et al.: no layer adaptation
    for biases and LayerNorm parameters); optax.lamb adapts every parameter."""
    return optax.chain(optax.scale_by_adam(b1=b1, b2=b2, eps=eps),
                       optax.add_decayed_weights(weight_decay, mask),
                       optax.masked(optax.scale_by_trust_ratio(), mask),
                       optax.scale_by_learning_rate(learning_rate))


@pytest.mark.parametrize("name, bias_correction, reference", [
    ("adamw", True, optax.adamw),
    ("lamb", False, lamb_of_the_paper),  # LAMB always bias-corrects
])
def test_bias_corrected_equals_optax(name, bias_correction, reference):
    config = OptimizerConfig(name=name, learning_rate=1e-2, warmup_steps=2, total_steps=10,
                             weight_decay=0.1, bias_correction=bias_correction, clip_norm=0.0)
    got = _run(make_optimizer(config), steps=4)
    want = _run(reference(make_schedule(config), b1=config.b1, b2=config.b2, eps=config.eps,
                          weight_decay=config.weight_decay, mask=decay_mask), steps=4)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7), got, want)


def test_lamb_leaves_biases_and_layer_norms_out_of_layer_adaptation():
    config = OptimizerConfig(name="lamb", learning_rate=1e-2, warmup_steps=0, total_steps=10,
                             weight_decay=0.0, clip_norm=0.0)
    got = _run(make_optimizer(config), steps=1)
    adam = _run(optax.chain(optax.scale_by_adam(b1=config.b1, b2=config.b2, eps=config.eps),
                            optax.scale_by_learning_rate(1e-2)), steps=1)
    everything = _run(optax.lamb(1e-2, b1=config.b1, b2=config.b2, eps=config.eps,
                                 weight_decay=0.0), steps=1)
    bias, kernel = ("layer", "mlp", "bias"), ("layer", "mlp", "kernel")

    def at(tree, path):
        for key in path:
            tree = tree[key]
        return np.asarray(tree)

    np.testing.assert_allclose(at(got, bias), at(adam, bias), rtol=1e-6)  # no trust ratio
    assert not np.allclose(at(everything, bias), at(adam, bias), rtol=1e-3)  # optax.lamb's
    np.testing.assert_allclose(at(got, kernel), at(everything, kernel), rtol=1e-6)
    assert not np.allclose(at(got, kernel), at(adam, kernel), rtol=1e-3)


def test_an_untrained_subtree_gets_no_weight_decay():
    config = OptimizerConfig(name="adamw", learning_rate=1e-2, warmup_steps=0, total_steps=10,
                             weight_decay=0.5)
    zeros = lambda step: jax.tree.map(np.zeros_like, _params())  # noqa: E731
    got = _run(make_optimizer(config, untrained=("layer/mlp",)), steps=3, grads_fn=zeros)
    start = _params()
    np.testing.assert_array_equal(got["layer"]["mlp"]["kernel"], start["layer"]["mlp"]["kernel"])
    assert np.all(np.abs(got["embeddings"]["word"]["embedding"])
                  < np.abs(start["embeddings"]["word"]["embedding"]))


def test_decay_mask_selects_kernels_and_embeddings():
    mask = decay_mask(_params())
    assert mask["embeddings"]["word"]["embedding"] and mask["layer"]["mlp"]["kernel"]
    assert not mask["embeddings"]["LayerNorm_0"]["scale"]
    assert not mask["embeddings"]["LayerNorm_0"]["bias"]
    assert not mask["layer"]["mlp"]["bias"]
    assert not mask["layer"]["output_norm"]["scale"]


@pytest.mark.parametrize("name", ["adamw", "lamb", "stable_adamw"])
def test_zero_grads_only_decay_masked_params(name):
    config = OptimizerConfig(name=name, learning_rate=1e-2, warmup_steps=0, total_steps=10,
                             weight_decay=0.5)
    zeros = lambda step: jax.tree.map(np.zeros_like, _params())  # noqa: E731
    got = _run(make_optimizer(config), steps=3, grads_fn=zeros)
    start = _params()
    mask = decay_mask(start)
    for (path, new), old, decays in zip(jax.tree_util.tree_leaves_with_path(got),
                                        jax.tree.leaves(start), jax.tree.leaves(mask)):
        if decays:
            assert np.all(np.abs(new) < np.abs(old)), path  # shrunk towards zero
        else:
            np.testing.assert_array_equal(new, old, err_msg=str(path))


def test_clipping_scales_gradients_before_the_moments():
    params = {"w": jnp.zeros(3)}
    grads = {"w": jnp.array([30.0, 40.0, 0.0])}  # global norm 50
    config = OptimizerConfig(learning_rate=1.0, warmup_steps=0, b1=0.5, weight_decay=0.0,
                             clip_norm=1.0)

    def first_moment(optimizer):
        _, state = optimizer.update(grads, optimizer.init(params), params)
        (adam_state,) = [s for s in state if isinstance(s, optax.ScaleByAdamState)]
        return np.asarray(adam_state.mu["w"])

    np.testing.assert_allclose(first_moment(make_optimizer(config)), [0.3, 0.4, 0.0], rtol=1e-6)
    unclipped = make_optimizer(dataclasses.replace(config, clip_norm=0.0))
    np.testing.assert_allclose(first_moment(unclipped), [15.0, 20.0, 0.0], rtol=1e-6)
    # Below the threshold clipping leaves gradients alone.
    generous = make_optimizer(dataclasses.replace(config, clip_norm=100.0))
    np.testing.assert_allclose(first_moment(generous), [15.0, 20.0, 0.0], rtol=1e-6)


@pytest.mark.parametrize("changes, message", [
    (dict(name="sgd"), "optimizer.name"),
    (dict(decay="step"), "optimizer.decay"),
    (dict(learning_rate=0.0), "learning_rate"),
    (dict(end_learning_rate=1.0), "end_learning_rate"),
    (dict(warmup_steps=20, total_steps=10), "warmup_steps"),
    (dict(total_steps=0, warmup_steps=0), "total_steps"),
    (dict(b1=1.0), "b1"),
    (dict(b2=-0.1), "b2"),
    (dict(weight_decay=-1.0), "weight_decay"),
    (dict(clip_norm=-1.0), "clip_norm"),
    (dict(decay="trapezoid"), "optimizer.decay must be one of .*wsd, wsd_sqrt, got 'trapezoid'"),
    (dict(decay_fraction=1.5), r"optimizer.decay_fraction must be in \[0, 1\], got 1.5"),
    (dict(decay_fraction=-0.1), r"optimizer.decay_fraction must be in \[0, 1\], got -0.1"),
    (dict(decay="wsd", warmup_steps=6, total_steps=10, decay_fraction=0.5),
     r"the warmup \(6 steps\) overlaps the wsd cooldown \(optimizer.decay_fraction 0.5 of 10 "
     r"steps: 5\); shorten either"),
])
def test_bad_configs_raise_user_error(changes, message):
    with pytest.raises(UserError, match=message) as refused:
        OptimizerConfig(**changes)
    assert "\n" not in str(refused.value)


@pytest.mark.parametrize("decay, quarter_way", [
    ("wsd", 1e-3 + (1e-5 - 1e-3) * 0.25),
    ("wsd_sqrt", 1e-3 + (1e-5 - 1e-3) * 0.5),  # 1 - sqrt(0.25)
])
def test_warmup_stable_decay_values_at_key_steps(decay, quarter_way):
    config = OptimizerConfig(learning_rate=1e-3, warmup_steps=100, total_steps=1100,
                             end_learning_rate=1e-5, decay=decay, decay_fraction=0.2)
    assert config.decay_steps == 220
    lr, jitted = make_schedule(config), jax.jit(make_schedule(config))
    want = {0: 0.0, 50: 5e-4, 100: 1e-3, 500: 1e-3, 880: 1e-3, 935: quarter_way, 1100: 1e-5,
            5000: 1e-5}
    for step, rate in want.items():
        assert float(lr(step)) == pytest.approx(rate, rel=1e-6, abs=1e-12), step
        # A function of the step alone (as the optimizer state's count, traced): a resumed run
        # gets the rates of an unbroken one. Compiled, it may round differently by an ulp.
        assert float(jitted(jnp.asarray(step, jnp.int32))) == pytest.approx(float(lr(step)),
                                                                             rel=1e-6), step
    assert float(lr(879)) == pytest.approx(1e-3)  # the last plateau step
    assert 1e-5 < float(lr(1099)) < float(lr(1098)) < 1e-3
    # The 1-sqrt cooldown drops fastest at its start; the linear one evenly.
    drop = float(lr(880)) - float(lr(881))
    assert drop == pytest.approx(9.9e-4 / 220, rel=0.05) if decay == "wsd" else drop > 3e-5


def test_warmup_stable_decay_edges():
    base = OptimizerConfig(learning_rate=1e-3, warmup_steps=0, total_steps=1100, decay="wsd")
    assert base.decay_steps == 110  # 0.1 * 1100 is 110.00000000000001: rounded, not ceiled
    assert float(make_schedule(base)(0)) == pytest.approx(1e-3)  # no warmup
    plateau = make_schedule(dataclasses.replace(base, decay_fraction=0.0, warmup_steps=10))
    assert [float(plateau(s)) for s in (5, 10, 1099)] == pytest.approx([5e-4, 1e-3, 1e-3])
    # Warmup may end exactly where the cooldown begins.
    whole = make_schedule(dataclasses.replace(base, warmup_steps=10, total_steps=20,
                                              decay_fraction=0.5))
    assert [float(whole(s)) for s in (5, 10, 15, 20)] == pytest.approx([5e-4, 1e-3, 5e-4, 0.0])


SPIKING = (("layer", "mlp", "kernel"), ("embeddings", "LayerNorm_0", "bias"))


def _spiking_grads(step):
    """A fixed direction per tensor, shrinking step by step but for a tenfold spike in two
    tensors at step 3: there g_t^2 dwarfs v^_t and StableAdamW must clip; elsewhere g_t^2 <= v^_t
    elementwise, so RMS_t <= 1 (random directions would make RMS_t a coin toss near 1)."""
    rng = np.random.default_rng(200)

    def grad(path, p):
        scale = 10.0 if step == 3 and tuple(_names(path)) in SPIKING else 1.0 / (step + 1)
        return (rng.normal(size=p.shape) * scale).astype(np.float32)

    return jax.tree_util.tree_map_with_path(grad, _params())


def _names(path):
    return [str(key.key) for key in path]


def _stable_adamw_reference(config, steps, lrs):
    """optimi's _single_param_stableadamw in float64: debiased betas (so the moments are m^_t and
    v^_t), per-tensor RMS against max(v^_t, eps^2), the clipped rate shrinking the weights first
    (by lr / max_lr with decouple_lr), then the Adam step. Returns params and each step's scales."""
    params = jax.tree.map(lambda p: p.astype(np.float64), _params())
    m = jax.tree.map(np.zeros_like, params)
    v = jax.tree.map(np.zeros_like, params)
    flat_mask = jax.tree.leaves(decay_mask(params))
    scales = []
    for step in range(steps):
        t = step + 1
        b1_hat = (config.b1 ** t - config.b1) / (config.b1 ** t - 1)
        b2_hat = (config.b2 ** t - config.b2) / (config.b2 ** t - 1)
        grads = [g.astype(np.float64) for g in jax.tree.leaves(_spiking_grads(step))]
        if config.clip_norm > 0:
            norm = np.sqrt(sum(np.sum(g ** 2) for g in grads))
            grads = [g * config.clip_norm / max(norm, config.clip_norm) for g in grads]
        leaves, tree = jax.tree.flatten(params)
        new, step_scales = [], []
        for i, (p, g, mi, vi) in enumerate(zip(leaves, grads, jax.tree.leaves(m),
                                               jax.tree.leaves(v))):
            mi[...] = b1_hat * mi + (1 - b1_hat) * g
            vi[...] = b2_hat * vi + (1 - b2_hat) * g * g
            rms = np.sqrt(np.mean(g ** 2 / np.maximum(vi, config.eps ** 2)))
            lr = lrs[step] / max(1.0, rms)
            step_scales.append(1.0 / max(1.0, rms))
            if flat_mask[i]:
                shrink = (lr / config.learning_rate if config.fully_decoupled_weight_decay
                          else lr) * config.weight_decay
                p = p * (1 - shrink)
            new.append(p - lr * mi / (np.sqrt(vi) + config.eps))
        params = jax.tree.unflatten(tree, new)
        scales.append(step_scales)
    return params, np.array(scales)


@pytest.mark.parametrize("clip_norm, fully_decoupled, weight_decay", [
    (0.0, False, 0.5),  # ModernBERT replaces gradient clipping with StableAdamW's
    (1.0, True, 1e-3),  # optimi's decouple_lr, as ModernBERT trains
])
def test_stable_adamw_matches_optimi_numpy_reference(clip_norm, fully_decoupled, weight_decay):
    config = OptimizerConfig(name="stable_adamw", learning_rate=1e-2, warmup_steps=2,
                             total_steps=12, decay="wsd_sqrt", decay_fraction=0.5, b2=0.98,
                             weight_decay=weight_decay, clip_norm=clip_norm,
                             fully_decoupled_weight_decay=fully_decoupled)
    rates = []
    got = _run(make_optimizer(config), steps=6, grads_fn=_spiking_grads, rates=rates)
    lrs = [1e-2 * min(s / 2, 1) * (1 - np.sqrt(np.clip((s - 6) / 6, 0, 1))) for s in range(6)]
    np.testing.assert_allclose(rates, lrs, rtol=1e-6)
    want, scales = _stable_adamw_reference(config, steps=6, lrs=lrs)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=2e-5, atol=1e-6), got, want)
    # The test can fail: at the spike two tensors are clipped (kernel: decayed; LayerNorm bias:
    # not), the others are not; before it nothing is (RMS_t 1 at most, up to rounding).
    spiked = np.array([tuple(_names(path)) in SPIKING
                       for path, _ in jax.tree_util.tree_leaves_with_path(_params())])
    assert np.all(scales[:3] > 1 - 1e-6)
    assert np.all(scales[3][spiked] < 0.9) and np.all(scales[3][~spiked] > 1 - 1e-6)
    adamw = _run(make_optimizer(dataclasses.replace(config, name="adamw", bias_correction=True)),
                 steps=6, grads_fn=_spiking_grads)
    assert not np.allclose(adamw["layer"]["mlp"]["kernel"], want["layer"]["mlp"]["kernel"],
                           rtol=1e-3)


def test_stable_adamw_update_scale():
    grad = jnp.array([3.0, 4.0, 0.0, 0.0])
    # mean(g^2 / v) = (9 + 16) / 4 with v = 1: RMS 2.5, the step divided by it.
    assert float(update_scale(grad, jnp.ones(4), 1e-6)) == pytest.approx(1 / 2.5)
    assert float(update_scale(grad, jnp.full(4, 100.0), 1e-6)) == 1.0  # RMS 0.25: untouched
    # v below eps^2 counts as eps^2: a fresh tensor's zero v does not divide by zero.
    assert float(update_scale(jnp.zeros(4), jnp.zeros(4), 1e-6)) == 1.0
    assert float(update_scale(jnp.zeros(0), jnp.zeros(0), 1e-6)) == 1.0


def test_fully_decoupled_weight_decay_follows_the_schedule_not_the_peak():
    config = OptimizerConfig(name="adamw", learning_rate=1e-2, warmup_steps=0, total_steps=10,
                             decay="constant", weight_decay=1e-3,
                             fully_decoupled_weight_decay=True)
    zeros = lambda step: jax.tree.map(np.zeros_like, _params())  # noqa: E731
    start = _params()["layer"]["mlp"]["kernel"]
    for name in ("adamw", "stable_adamw"):
        got = _run(make_optimizer(dataclasses.replace(config, name=name)), 3, grads_fn=zeros)
        # At the peak each step shrinks by weight_decay itself, whatever learning_rate is.
        np.testing.assert_allclose(got["layer"]["mlp"]["kernel"], start * (1 - 1e-3) ** 3,
                                   rtol=1e-6)
