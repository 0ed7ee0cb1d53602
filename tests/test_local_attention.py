"""bertjax.model.local_attention: block-by-block sliding-window attention equals masked full
attention under Hugging Face ModernBert's band (|i - j| <= half_window, less padding keys and
other packed sequences) in value and gradients, at any length against the window, under jit,
vmap, lax.cond and lax.scan, and never builds an [L, L] matrix once the row is longer than three
blocks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.model.local_attention import band_mask, sliding_window_attention

HEADS, DIM = 2, 4
FILL = -0.7 * np.finfo(np.float32).max


def numpy_reference(q, k, v, allowed):
    """float64 masked full attention; allowed bool [B, L, L]."""
    q, k, v = (np.asarray(x, np.float64) for x in (q, k, v))
    logits = np.einsum("btnd,bsnd->bnts", q, k) / np.sqrt(q.shape[-1])
    logits = np.where(allowed[:, None], logits, FILL)
    logits -= logits.max(-1, keepdims=True)
    probs = np.exp(logits)
    probs /= probs.sum(-1, keepdims=True)
    return np.einsum("bnts,bsnd->btnd", probs, v)


def allowed_of(key_mask, half_window, pack_ids=None):
    allowed = key_mask[:, None, :] & band_mask(key_mask.shape[1], half_window)[None]
    if pack_ids is not None:
        allowed &= pack_ids[:, :, None] == pack_ids[:, None, :]
    return allowed


def jnp_full(q, k, v, key_mask, half_window, pack_ids=None):
    """The masked [L, L] computation in jax, for gradients."""
    allowed = allowed_of(key_mask, half_window, pack_ids)
    logits = jnp.einsum("btnd,bsnd->bnts", q, k, preferred_element_type=jnp.float32)
    logits = jnp.where(allowed[:, None], logits / np.sqrt(q.shape[-1]), jnp.float32(FILL))
    return jnp.einsum("bnts,bsnd->btnd", jax.nn.softmax(logits, -1).astype(v.dtype), v)


def inputs(length, batch=2, seed=0, dtype=np.float32):
    rng = np.random.default_rng(seed)
    return [rng.standard_normal((batch, length, HEADS, DIM)).astype(dtype) for _ in range(3)]


def masks(kind, length, batch=2, seed=0):
    rng = np.random.default_rng(seed + 1)
    if kind == "none":
        return np.ones((batch, length), bool)
    if kind == "suffix":
        lengths = rng.integers(1, length + 1, batch)
        lengths[0] = length
        return np.arange(length)[None] < lengths[:, None]
    key_mask = rng.random((batch, length)) < 0.7
    key_mask[:, 0] = True
    return key_mask


def seen_rows(allowed):
    """[B, L, 1, 1]: queries with at least one key to see; a fully masked row averages over
    different keys in the two computations (documented in the module)."""
    return allowed.any(-1)[:, :, None, None]


CASES = [  # (L, half_window, block_size)
    (1, 0, None), (1, 3, None), (2, 0, None), (3, 5, None), (5, 2, None),  # L <= 3 blocks
    (7, 1, None), (12, 2, None), (13, 2, None), (17, 3, None), (10, 0, None),  # blocked
    (16, 4, None), (11, 2, 3), (23, 3, 5), (9, 20, None), (4, 4, 1),
]


@pytest.mark.parametrize("mask_kind", ["none", "suffix", "arbitrary"])
@pytest.mark.parametrize("length,half_window,block_size", CASES)
def test_matches_masked_full_attention(length, half_window, block_size, mask_kind):
    if block_size is not None and block_size < max(half_window, 1):
        with pytest.raises(ValueError, match="narrower"):
            sliding_window_attention(*inputs(length), masks(mask_kind, length), half_window,
                                     block_size=block_size)
        return
    q, k, v = inputs(length)
    key_mask = masks(mask_kind, length)
    out = sliding_window_attention(q, k, v, key_mask, half_window, block_size=block_size)
    allowed = allowed_of(key_mask, half_window)
    expected = numpy_reference(q, k, v, allowed)
    assert out.shape == q.shape and out.dtype == jnp.float32
    assert np.all(np.isfinite(out))
    np.testing.assert_allclose(np.where(seen_rows(allowed), out, 0),
                               np.where(seen_rows(allowed), expected, 0), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("length,half_window", [(6, 1), (19, 2), (24, 3), (30, 40)])
def test_packed_sequences_see_only_their_own(length, half_window):
    q, k, v = inputs(length, seed=length)
    rng = np.random.default_rng(length)
    # Sorted ids: contiguous packed sequences, the last one possibly padding.
    pack_ids = np.sort(rng.integers(0, 4, (2, length)), axis=1)
    key_mask = masks("suffix", length, seed=length)
    out = jax.jit(sliding_window_attention, static_argnums=4)(q, k, v, key_mask, half_window,
                                                              pack_ids)
    allowed = allowed_of(key_mask, half_window, pack_ids)
    expected = numpy_reference(q, k, v, allowed)
    np.testing.assert_allclose(np.where(seen_rows(allowed), out, 0),
                               np.where(seen_rows(allowed), expected, 0), atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("length,half_window,packed", [(14, 2, False), (21, 3, True),
                                                       (5, 2, False)])
def test_gradients_match_masked_full_attention(length, half_window, packed):
    q, k, v = inputs(length, seed=3)
    key_mask = masks("arbitrary", length, seed=3)
    pack_ids = np.sort(np.random.default_rng(4).integers(0, 3, (2, length)), 1) if packed else None
    weights = np.random.default_rng(5).standard_normal(q.shape).astype(np.float32)
    weights *= seen_rows(allowed_of(key_mask, half_window, pack_ids))

    def loss(attend):
        return lambda q, k, v: jnp.sum(attend(q, k, v, key_mask, half_window, pack_ids) * weights)

    got = jax.jit(jax.grad(loss(sliding_window_attention), argnums=(0, 1, 2)))(q, k, v)
    want = jax.jit(jax.grad(loss(jnp_full), argnums=(0, 1, 2)))(q, k, v)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, atol=1e-5, rtol=1e-5)


def test_bfloat16_inputs():
    q, k, v = inputs(20, seed=6)
    key_mask = masks("suffix", 20, seed=6)
    low = [jnp.asarray(x, jnp.bfloat16) for x in (q, k, v)]
    out = sliding_window_attention(*low, key_mask, 3)
    assert out.dtype == jnp.bfloat16
    allowed = allowed_of(key_mask, 3)
    expected = numpy_reference(*(np.asarray(x, np.float32) for x in low), allowed)
    np.testing.assert_allclose(np.where(seen_rows(allowed), np.asarray(out, np.float32), 0),
                               np.where(seen_rows(allowed), expected, 0), atol=3e-2, rtol=3e-2)


def test_vmap_lax_cond_and_scan():
    q, k, v = inputs(15, batch=3, seed=7)
    key_mask = masks("suffix", 15, batch=3, seed=7)
    per_row = jax.vmap(lambda q, k, v, m: sliding_window_attention(
        q[None], k[None], v[None], m[None], 2)[0])
    np.testing.assert_allclose(per_row(q, k, v, key_mask),
                               sliding_window_attention(q, k, v, key_mask, 2), atol=1e-6)

    @jax.jit
    def either(is_global, q, k, v):
        return jax.lax.cond(is_global, lambda *a: jnp_full(*a, key_mask, 15),
                            lambda *a: sliding_window_attention(*a, key_mask, 2), q, k, v)

    for is_global, half_window in ((True, 15), (False, 2)):
        allowed = allowed_of(key_mask, half_window)
        expected = numpy_reference(q, k, v, allowed)
        np.testing.assert_allclose(np.where(seen_rows(allowed), either(is_global, q, k, v), 0),
                                   np.where(seen_rows(allowed), expected, 0), atol=1e-5, rtol=1e-5)

    def layer(x, _):  # as nn.scan runs a stack of layers
        return sliding_window_attention(x, x, x, np.ones((3, 15), bool), 2), None

    stacked, _ = jax.lax.scan(layer, q, None, length=2)
    twice = layer(layer(q, None)[0], None)[0]
    np.testing.assert_allclose(stacked, twice, atol=1e-6)


def test_no_length_squared_intermediate():
    length, half_window = 64, 4
    q, k, v = inputs(length)
    key_mask = masks("suffix", length)
    jaxpr = jax.make_jaxpr(jax.grad(
        lambda q: jnp.sum(sliding_window_attention(q, k, v, key_mask, half_window))))(q)
    largest = max(int(np.prod(var.aval.shape)) for eqn in jaxpr.jaxpr.eqns
                  for var in eqn.outvars if hasattr(var.aval, "shape"))
    assert largest <= 2 * HEADS * length * 3 * half_window  # [B, N, L, 3w], not [B, N, L, L]


def test_band_mask_and_bad_arguments():
    np.testing.assert_array_equal(band_mask(4, 1), [[1, 1, 0, 0], [1, 1, 1, 0],
                                                    [0, 1, 1, 1], [0, 0, 1, 1]])
    assert band_mask(3, 0).sum() == 3 and band_mask(3, 7).all()
    with pytest.raises(ValueError, match=">= 0"):
        sliding_window_attention(*inputs(4), masks("none", 4), -1)
