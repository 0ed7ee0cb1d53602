"""The encoder and pretraining heads: size, dtypes, masking, scan/remat equivalence, sharding."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AxisType, NamedSharding, PartitionSpec

from bertjax.core.errors import UserError
from bertjax.interop import hf_layout
from bertjax.model.config import EncoderConfig, preset
from bertjax.model.attention import attention, explicit_attention
from bertjax.model.encoder import Encoder
from bertjax.model.heads import BertForPretraining

B, L, P, V = 2, 11, 3, 37  # distinct sizes, so a [B, L, V] value is recognisable in a jaxpr


def tiny(**changes) -> EncoderConfig:
    fields = dict(vocab_size=V, hidden_size=24, num_layers=2, num_heads=3, intermediate_size=40,
                  max_position_embeddings=16)
    return EncoderConfig(**{**fields, **changes})


def make_batch(seed: int = 0, vocab: int = V) -> dict:
    rng = np.random.default_rng(seed)
    input_mask = np.ones((B, L), np.int32)
    input_mask[1, 6:] = 0
    batch = {
        "input_ids": rng.integers(5, vocab, (B, L)),
        "segment_ids": (np.arange(L) >= 4).astype(np.int32)[None].repeat(B, 0) * input_mask,
        "input_mask": input_mask,
        "masked_positions": np.array([[1, 5, 9], [2, 3, 0]]),
        "span_left": np.array([[0, 4, 8], [1, 1, 0]]),
        "span_right": np.array([[2, 6, 10], [4, 4, 0]]),
        "span_offset": np.array([[0, 0, 0], [0, 1, 0]]),
    }
    return {k: jnp.asarray(v, jnp.int32) for k, v in batch.items()}


def random_params(model: nn.Module, *inputs, seed: int = 0, scale: float = 0.2) -> dict:
    """Random weights everywhere (biases and LayerNorms too) in the model's layout and dtypes.

    Much faster than compiling `model.init`, and no parameter is left at a trivial value.
    """
    shapes = nn.unbox(jax.eval_shape(model.init, jax.random.key(0), *inputs))["params"]
    rng = np.random.default_rng(seed)
    return jax.tree.map(
        lambda s: jnp.asarray(rng.normal(0.0, scale, s.shape), s.dtype), shapes)


def dropout_key(seed: int) -> jax.Array:
    # The "rbg" generator compiles much faster than threefry on CPU; the model does not care.
    return jax.random.key(seed, impl="rbg")


def compiled_unoptimized(fn, *args, **jit_kwargs):
    """jax.jit(fn) compiled for `args` without LLVM's optimisation passes: on CPU they take most
    of the seconds a gradient of even a tiny model needs to compile, and change nothing that the
    comparisons here check (both sides are compiled the same way)."""
    lowered = jax.jit(fn, **jit_kwargs).lower(*args)
    return lowered.compile(compiler_options={"xla_backend_optimization_level": 0})


def test_bert_base_with_mlm_and_nsp_has_hugging_faces_parameter_count():
    shapes = jax.eval_shape(BertForPretraining(preset("base")).init, jax.random.key(0),
                            make_batch(vocab=30522))
    count = sum(int(np.prod(x.shape)) for x in jax.tree.leaves(nn.unbox(shapes)))
    assert count == 110_106_428  # transformers' BertForPreTraining(BertConfig())


@pytest.mark.optimized
@pytest.mark.slow
def test_bf16_compute_keeps_fp32_params_logits_and_gradients():
    cfg = tiny(dtype="bfloat16", param_dtype="float32", scan_layers=True)
    model = BertForPretraining(cfg, sbo=True)
    batch = make_batch()
    shapes = jax.eval_shape(model.init, jax.random.key(0), batch)
    assert {x.dtype for x in jax.tree.leaves(nn.unbox(shapes))} == {jnp.dtype("float32")}
    params = random_params(model, batch, scale=0.1)

    def loss(p, m):
        # Dropout on, so the explicit attention path runs in bf16 too.
        out = m.apply({"params": p}, batch, deterministic=False, rngs={"dropout": dropout_key(0)})
        return sum(jnp.mean(v ** 2) for v in out.values()), out

    grad_fn = jax.value_and_grad(lambda p: loss(p, model), has_aux=True)
    (_, out), grads = compiled_unoptimized(grad_fn, params)(params)
    assert out["mlm_logits"].shape == (B, P, V) and out["mlm_logits"].dtype == jnp.float32
    assert out["sbo_logits"].shape == (B, P, V) and out["sbo_logits"].dtype == jnp.float32
    assert out["nsp_logits"].shape == (B, 2) and out["nsp_logits"].dtype == jnp.float32
    assert all(g.dtype == jnp.float32 and np.isfinite(g).all() for g in jax.tree.leaves(grads))
    # Same weights and dropout masks in fp32: bf16 is close, not merely finite.
    reference = jax.jit(lambda p: loss(p, BertForPretraining(cfg.replace(dtype="float32"),
                                                             sbo=True))[1])(params)
    for key in out:
        scale = np.abs(reference[key]).max()
        assert np.abs(out[key] - reference[key]).max() < 0.05 * scale, key
    encoded = jax.eval_shape(Encoder(cfg).apply, {"params": params["encoder"]},
                             batch["input_ids"], batch["segment_ids"], batch["input_mask"])
    assert encoded.sequence.shape == (B, L, 24) and encoded.sequence.dtype == jnp.bfloat16
    assert encoded.pooled.shape == (B, 24)


def test_padded_positions_do_not_change_real_outputs():
    cfg = tiny()
    batch = make_batch()
    encoder = Encoder(cfg)
    params = random_params(encoder, batch["input_ids"], batch["segment_ids"], batch["input_mask"])
    run = jax.jit(lambda ids, seg: encoder.apply({"params": params}, ids, seg,
                                                 batch["input_mask"]))
    before = run(batch["input_ids"], batch["segment_ids"])
    pad = batch["input_mask"] == 0
    after = run(jnp.where(pad, 7, batch["input_ids"]), jnp.where(pad, 1, batch["segment_ids"]))
    real = np.asarray(batch["input_mask"], bool)
    np.testing.assert_allclose(after.sequence[real], before.sequence[real], atol=1e-6)
    np.testing.assert_allclose(after.pooled, before.pooled, atol=1e-6)
    # ... while the real tokens do matter (the check above can fail).
    changed = run(batch["input_ids"].at[1, 2].set(8), batch["segment_ids"])
    assert np.abs(changed.sequence[1, 0] - before.sequence[1, 0]).max() > 1e-4


def _to_scanned(loop_params: dict, cfg: EncoderConfig) -> dict:
    state_dict = hf_layout.to_hf_state_dict(loop_params, cfg)
    params, missing, unused = hf_layout.from_hf_state_dict(state_dict, cfg, scan_layers=True)
    assert not missing and not unused
    params["sbo"] = loop_params["sbo"]  # no Hugging Face counterpart
    return params


def test_scan_and_loop_give_the_same_outputs_for_the_same_weights():
    batch = make_batch()
    loop = BertForPretraining(tiny(), sbo=True)
    scan = BertForPretraining(tiny(scan_layers=True), sbo=True)
    loop_params = random_params(loop, batch)
    scan_params = _to_scanned(loop_params, loop.config)
    assert scan_params["encoder"]["layers"]["attention"]["query"]["kernel"].shape == (2, 24, 3, 8)
    got = jax.jit(scan.apply)({"params": scan_params}, batch)
    want = jax.jit(loop.apply)({"params": loop_params}, batch)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], atol=1e-6, rtol=1e-6)


@pytest.mark.parametrize("scan_layers,policies", [(False, ("full",)),
                                                  (True, ("full", "save_dots"))])
@pytest.mark.optimized
@pytest.mark.slow
def test_remat_policies_give_the_same_outputs_and_gradients(scan_layers, policies):
    batch = make_batch()
    inputs = (batch["input_ids"], batch["segment_ids"], batch["input_mask"])
    results = {}
    for remat in ("none", *policies):
        # One layer suffices for the loop (its compile time grows with depth; scan's does not).
        layers = 2 if scan_layers else 1
        encoder = Encoder(tiny(scan_layers=scan_layers, remat=remat, num_layers=layers))
        params = random_params(encoder, *inputs)  # same seed and layout: identical weights

        def loss(p):
            # Dropout on: remat must replay the same masks in the backward pass.
            out = encoder.apply({"params": p}, *inputs, deterministic=False,
                                rngs={"dropout": dropout_key(3)})
            return jnp.sum(out.sequence ** 2) + jnp.sum(out.pooled)

        results[remat] = compiled_unoptimized(jax.value_and_grad(loss), params)(params)
    value, grads = results["none"]
    for remat in policies:
        other_value, other_grads = results[remat]
        np.testing.assert_allclose(other_value, value, rtol=1e-5)
        jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5),
                     other_grads, grads)


@pytest.mark.parametrize("dtype,tol", [("float32", 1e-6), ("bfloat16", 2e-2)])
def test_explicit_attention_matches_the_fused_path(dtype, tol):
    rng = np.random.default_rng(0)
    q, k, v = (jnp.asarray(rng.normal(size=(2, 7, 3, 8)), dtype) for _ in range(3))
    mask = jnp.arange(7)[None, None, None, :] < jnp.array([7, 4])[:, None, None, None]
    fused = jax.jit(attention)(q, k, v, mask)  # no dropout: jax.nn.dot_product_attention
    explicit = jax.jit(explicit_attention)(q, k, v, mask)
    assert fused.dtype == explicit.dtype == jnp.dtype(dtype)
    np.testing.assert_allclose(np.asarray(explicit, np.float32), np.asarray(fused, np.float32),
                               atol=tol, rtol=tol)
    dropped = jax.jit(attention, static_argnames="dropout_rate")(
        q, k, v, mask, dropout_rate=0.5, dropout_rng=dropout_key(1))
    assert np.abs(np.asarray(dropped, np.float32) - np.asarray(fused, np.float32)).max() > 0.1


def test_attention_dropout_is_active_only_when_not_deterministic():
    batch = make_batch()
    model = BertForPretraining(tiny(hidden_dropout=0.0, attention_dropout=0.3))
    params = random_params(model, batch)
    apply = jax.jit(model.apply, static_argnames="deterministic")
    fixed = [apply({"params": params}, batch, deterministic=True,
                   rngs={"dropout": dropout_key(s)})["mlm_logits"] for s in (1, 2)]
    np.testing.assert_array_equal(fixed[0], fixed[1])
    noisy = [apply({"params": params}, batch, deterministic=False,
                   rngs={"dropout": dropout_key(s)})["mlm_logits"] for s in (1, 2)]
    assert np.abs(noisy[0] - noisy[1]).max() > 1e-2
    assert np.abs(noisy[0] - fixed[0]).max() > 1e-2


def _leaves_with_paths(tree):
    return jax.tree_util.tree_leaves_with_path(
        tree, is_leaf=lambda x: isinstance(x, PartitionSpec))


@pytest.mark.parametrize("scan_layers", [False, True])
def test_every_parameter_has_logical_axis_names(scan_layers):
    model = BertForPretraining(tiny(scan_layers=scan_layers), sbo=True)
    abstract = jax.eval_shape(model.init, jax.random.key(0), make_batch())
    boxed = jax.tree.leaves(abstract, is_leaf=lambda x: isinstance(x, nn.LogicallyPartitioned))
    assert all(isinstance(leaf, nn.LogicallyPartitioned) for leaf in boxed)
    specs = nn.get_partition_spec(abstract)
    shapes = dict(jax.tree_util.tree_leaves_with_path(nn.unbox(abstract)))
    known = {"vocab", "embed", "heads", "kv", "mlp", "norm", "layers", None}
    spec_leaves = _leaves_with_paths(specs)
    assert len(spec_leaves) == len(shapes)
    for path, spec in spec_leaves:
        assert isinstance(spec, PartitionSpec), path
        assert len(spec) == len(shapes[path].shape), (path, spec)
        assert set(spec) <= known, (path, spec)
    encoder = specs["params"]["encoder"]
    query = (encoder["layers"] if scan_layers else encoder["layer_1"])["attention"]["query"]
    expected = ("embed", "heads", "kv")
    assert tuple(query["kernel"]) == (("layers",) if scan_layers else ()) + expected
    assert tuple(encoder["embeddings"]["word_embeddings"]) == ("vocab", "embed")


def _value_shapes(jaxpr) -> list[tuple]:
    """Shapes of every value a jaxpr computes, inside scan/remat/jit bodies too."""
    shapes = []
    for eqn in jaxpr.eqns:
        shapes += [tuple(getattr(v.aval, "shape", ())) for v in eqn.outvars]
        for param in eqn.params.values():
            for sub in param if isinstance(param, (tuple, list)) else (param,):
                inner = getattr(sub, "jaxpr", sub)
                if hasattr(inner, "eqns"):
                    shapes += _value_shapes(inner)
    return shapes


@pytest.mark.parametrize("scan_layers", [False, True])
def test_vocabulary_scores_exist_only_at_masked_positions(scan_layers):
    model = BertForPretraining(tiny(scan_layers=scan_layers, remat="full"), sbo=True)
    batch = make_batch()
    params = random_params(model, batch)

    def loss(p):
        out = model.apply({"params": p}, batch, deterministic=False,
                          rngs={"dropout": jax.random.key(1)})
        return out["mlm_logits"].sum() + out["sbo_logits"].sum()

    shapes = _value_shapes(jax.make_jaxpr(jax.grad(loss))(params).jaxpr)
    assert (B, P, V) in shapes  # the walk does see the projection
    assert not [s for s in shapes if len(s) >= 2 and s[-1] == V and L in s]


def test_sharding_constraints_are_valid_on_a_mesh():
    mesh = jax.make_mesh((2, 2, 2), ("data", "fsdp", "tensor"), axis_types=(AxisType.Auto,) * 3)
    rules = (("batch", ("data", "fsdp")), ("vocab", "tensor"), ("heads", "tensor"),
             ("mlp", "tensor"), ("embed", "fsdp"), ("kv", None), ("length", None),
             ("norm", None), ("layers", None))
    cfg = tiny(vocab_size=40, num_heads=2, hidden_size=16, scan_layers=True)
    model = BertForPretraining(cfg, sbo=True)
    batch = jax.tree.map(lambda x: jnp.concatenate([x, x]), make_batch(vocab=40))  # 4 rows
    params = random_params(model, batch)
    want = jax.jit(model.apply)({"params": params}, batch)

    def sharded_apply(p, b):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(rules):
            return model.apply({"params": p}, b)

    batch_sharding = NamedSharding(mesh, PartitionSpec(("data", "fsdp")))
    sharded_batch = jax.device_put(batch, batch_sharding)
    lowered = jax.jit(sharded_apply).lower(params, sharded_batch)
    text = lowered.as_text()
    # The rules are live: activations carry constraints (q/k/v split heads over "tensor").
    assert text.count("sharding_constraint") >= 8
    assert '[{"data", "fsdp"}, {}, {"tensor"}, {}]' in text
    got = lowered.compile()(params, sharded_batch)
    for key in want:
        np.testing.assert_allclose(got[key], want[key], atol=1e-5, rtol=1e-5)


def test_span_offsets_beyond_the_table_are_clipped():
    model = BertForPretraining(tiny(), nsp=False, sbo=True, max_span_length=4)
    batch = make_batch()
    params = random_params(model, batch)
    assert params["sbo"]["position_embeddings"].shape == (4, 24)
    assert "nsp" not in params
    apply = jax.jit(model.apply)
    far = apply({"params": params}, {**batch, "span_offset": jnp.full((B, P), 50, jnp.int32)})
    last = apply({"params": params}, {**batch, "span_offset": jnp.full((B, P), 3, jnp.int32)})
    first = apply({"params": params}, {**batch, "span_offset": jnp.zeros((B, P), jnp.int32)})
    np.testing.assert_array_equal(far["sbo_logits"], last["sbo_logits"])
    assert np.abs(last["sbo_logits"] - first["sbo_logits"]).max() > 1e-4
    assert set(far) == {"mlm_logits", "sbo_logits"}


def test_sequences_longer_than_the_position_table_are_a_user_error():
    encoder = Encoder(tiny())
    ids = jnp.zeros((1, 17), jnp.int32)
    with pytest.raises(UserError, match="max_position_embeddings"):
        jax.eval_shape(encoder.init, jax.random.key(0), ids, ids, ids)
