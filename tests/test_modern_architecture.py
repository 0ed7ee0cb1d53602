"""ModernBERT's architecture options, each against a numpy reference, and the settings that
cannot work refused in one line (exit 2) before anything is written. End-to-end parity with
transformers' ModernBert is tests/test_modernbert_hf.py."""

import math

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.core.errors import UserError
from bertjax.model import rotary
from bertjax.model.attention import context
from bertjax.model.config import preset
from bertjax.model.encoder import Encoder, TransformerLayer
from bertjax.model.layout import to_scanned
import cli_in_process
from cli_checks import assert_one_line_error

MODERN = dict(position_embedding="rope", rope_theta=160_000.0, norm="pre", mlp="geglu",
              use_bias=False, norm_bias=False, global_attention_every=3, sliding_window=8,
              type_vocab_size=0, layer_norm_eps=1e-5, hidden_dropout=0.0, attention_dropout=0.0)


def _tiny(**changes):
    sizes = dict(num_layers=3, hidden_size=32, num_heads=2, intermediate_size=64, vocab_size=50,
                 max_position_embeddings=64, scan_layers=True)
    return preset("tiny", **{**sizes, **MODERN, **changes})


def test_rotary_positions_rotate_each_half_pair_as_transformers_does():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(2, 7, 3, 8)).astype(np.float32)
    positions = np.stack([np.arange(7), np.array([0, 1, 2, 0, 1, 2, 3])])  # a packed row
    theta = 10_000.0
    inv = 1.0 / theta ** (np.arange(0, 8, 2) / 8)
    angles = positions[..., None] * inv  # [B, L, 4]
    cos, sin = np.cos(angles)[:, :, None], np.sin(angles)[:, :, None]
    first, second = x[..., :4], x[..., 4:]
    expected = np.concatenate([first * cos - second * sin, second * cos + first * sin], -1)
    got = rotary.rotate(jnp.asarray(x), *rotary.tables(jnp.asarray(positions), 8, theta))
    np.testing.assert_allclose(got, expected, atol=2e-5)


def _layer_params(config, x, index):
    layer = TransformerLayer(config)
    ctx = context(config, jnp.ones(x.shape[:2], jnp.int32))
    params = nn.unbox(layer.init(jax.random.PRNGKey(1), x, ctx, index, True))
    return layer, ctx, params


def test_a_pre_norm_geglu_layer_without_biases_is_the_reference_computation():
    """Layer 1 (local, normed input) of ModernBERT, recomputed in numpy from its parameters."""
    config = _tiny()
    rng = np.random.default_rng(2)
    x = jnp.asarray(rng.normal(size=(1, 12, 32)).astype(np.float32))
    layer, ctx, params = _layer_params(config, x, 1)
    p = jax.tree.map(np.asarray, params["params"])
    assert "bias" not in p["intermediate"] and "bias" not in p["attention_norm"]
    got = np.asarray(layer.apply(params, x, ctx, 1, True)[0])[0]

    def norm(v, scale):
        mean = v.mean(-1, keepdims=True)
        return (v - mean) / np.sqrt(((v - mean) ** 2).mean(-1, keepdims=True) + 1e-5) * scale

    h = np.asarray(x)[0].astype(np.float64)
    a = norm(h, p["attention_norm"]["scale"])
    q, k, v = (np.einsum("lh,hnd->lnd", a, p["attention"][n]["kernel"])
               for n in ("query", "key", "value"))
    cos, sin = (np.asarray(t)[0][:, None] for t in
                rotary.tables(jnp.arange(12)[None], 16, config.rope_local_theta))
    rot = lambda t: t * cos + np.concatenate([-t[..., 8:], t[..., :8]], -1) * sin  # noqa: E731
    q, k = rot(q), rot(k)
    logits = np.einsum("tnd,snd->nts", q, k) / 4.0
    band = np.abs(np.arange(12)[:, None] - np.arange(12)[None]) <= 4
    logits = np.where(band[None], logits, -np.inf)
    probs = np.exp(logits - logits.max(-1, keepdims=True))
    probs /= probs.sum(-1, keepdims=True)
    attended = np.einsum("nts,snd->tnd", probs, v)
    h = h + np.einsum("tnd,ndh->th", attended, p["attention"]["output"]["kernel"])
    up = norm(h, p["output_norm"]["scale"]) @ p["intermediate"]["kernel"]
    value, gate = up[:, :32], up[:, 32:]
    gelu = 0.5 * value * (1 + np.vectorize(math.erf)(value / np.sqrt(2)))
    expected = h + (gelu * gate) @ p["output"]["kernel"]
    np.testing.assert_allclose(got, expected, atol=2e-5, rtol=1e-4)


def test_layer_zero_attends_to_its_input_unnormed():
    """Transformers' ModernBert has no norm before layer 0's attention (the embeddings' norm has
    just run): zeroing that layer's attention norm changes nothing, layer 1's changes a lot."""
    config = _tiny()
    x = jnp.asarray(np.random.default_rng(3).normal(size=(1, 10, 32)).astype(np.float32))
    for index, changes in ((0, False), (1, True)):
        layer, ctx, params = _layer_params(config, x, index)
        zeroed = jax.tree.map(lambda a: a, params)
        zeroed["params"]["attention_norm"]["scale"] = jnp.zeros(32)
        before = layer.apply(params, x, ctx, index, True)[0]
        after = layer.apply(zeroed, x, ctx, index, True)[0]
        assert (float(jnp.abs(before - after).max()) > 1e-3) == changes


def test_the_modern_encoder_has_modernberts_parameters_only():
    config = _tiny()
    ids = jnp.ones((1, 16), jnp.int32)
    shapes = jax.eval_shape(Encoder(config).init, jax.random.PRNGKey(0), ids, ids * 0, ids)
    params = nn.unbox(shapes)["params"]
    assert set(params["embeddings"]) == {"word_embeddings", "layer_norm"}
    assert set(params["embeddings"]["layer_norm"]) == {"scale"}
    assert set(params["final_norm"]) == {"scale"}
    layer = params["layers"]
    assert layer["intermediate"]["kernel"].shape == (3, 32, 64)
    assert layer["output"]["kernel"].shape == (3, 32, 32)  # GeGLU halves the width
    assert all("bias" not in layer[n] for n in ("intermediate", "output", "attention_norm"))


@pytest.mark.slow
def test_scanned_layers_choose_each_layers_attention_kind_like_a_loop():
    """Under nn.scan the kind (global or sliding window) is chosen per layer at run time."""
    ids = jnp.asarray(np.random.default_rng(4).integers(5, 50, (2, 40)), jnp.int32)
    mask = jnp.ones_like(ids).at[1, 29:].set(0)
    loop = Encoder(_tiny(scan_layers=False))
    params = nn.unbox(jax.jit(loop.init)(jax.random.PRNGKey(0), ids, ids * 0, mask))
    scanned_params = {"params": to_scanned(jax.device_get(params["params"]))}
    a = jax.jit(loop.apply)(params, ids, ids * 0, mask).sequence
    scanned = Encoder(_tiny(scan_layers=True))
    b = jax.jit(scanned.apply)(scanned_params, ids, ids * 0, mask).sequence
    np.testing.assert_allclose(a, b, atol=1e-5)


@pytest.mark.parametrize("changes, phrase", [
    (dict(sliding_window=64), "model.sliding_window 64 is not narrower"),
    (dict(sliding_window=7), "model.sliding_window is a width, even"),
    (dict(intermediate_size=63), "odd"),
    (dict(num_heads=32, hidden_size=32), "head size 1 is odd"),
    (dict(rope_theta=5.0), "model.rope_theta=5.0 gives rotary positions"),
    (dict(global_attention_every=0), "model.global_attention_every must be >= 1"),
    (dict(position_embedding="alibi"), "model.position_embedding"),
    (dict(norm="sandwich"), "model.norm"),
])
def test_impossible_architectures_are_refused_by_name(changes, phrase):
    with pytest.raises(UserError, match=phrase.replace(".", r"\.").replace("(", r"\(")):
        _tiny(**changes)


@pytest.mark.parametrize("override, phrase", [
    ("--config.model.sliding_window=16384", "model.sliding_window 16384 is not narrower"),
    ("--config.model.intermediate_size=2303", "2303 is odd"),
    ("--config.model.rope_theta=1000.0", "model.rope_theta=1000.0"),
    ("--config.model.sliding_window=2048", "model.sliding_window 2048 is wider than the longest"),
])
def test_the_cli_refuses_them_in_one_line_before_writing(tmp_path, override, phrase):
    workdir = tmp_path / "run"
    run = cli_in_process.run("main", "--config=configs/modernbert.py", f"--workdir={workdir}",
                             "--config.data.input=nowhere.txt", override)
    assert_one_line_error(run.returncode, run.stderr, phrase)
    assert not workdir.exists()
