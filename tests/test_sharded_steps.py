"""Data-parallel, FSDP, tensor-parallel and mixed meshes on 8 fake CPU devices: each sharded step
equals the one-device step, and the arrays are really laid out as the rules table says (read off
their `.sharding`); bf16 compute keeps fp32 master parameters; the platform presets fit their
platforms."""

import importlib
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import PartitionSpec as P

from bertjax.core.errors import UserError
from bertjax.model.config import preset
from bertjax.model.heads import BertForPretraining
from bertjax.parallel import partitioning
from bertjax.parallel.mesh import make_mesh, resolve_axis_sizes
from bertjax.train.optimizer import OptimizerConfig, make_optimizer
from bertjax.train.state import StatePlan, abstract_train_state, create_train_state
from bertjax.train.step import make_train_step

B, L, PRED, V, STEPS = 8, 32, 6, 512, 2
OPTIMIZER = OptimizerConfig(learning_rate=2e-3, warmup_steps=0, total_steps=100)
# Neither LLVM's optimisation passes nor XLA:CPU's fusion emitters: together they are most of
# the compile time of these steps on CPU. Every side of every comparison is compiled the same way.
FAST_COMPILE = {"xla_backend_optimization_level": 0, "xla_cpu_use_fusion_emitters": False}
# (data, fsdp, tensor). Remat policies ride along: recomputation must not change a single value
# (dropout masks included), so these steps still equal the plain one-device step.
MESHES = {
    "data": ((8, 1, 1), "none"),
    "fsdp": ((1, 8, 1), "full"),
    "tensor": ((1, 1, 8), "none"),
    "mixed": ((2, 2, 2), "save_dots"),
}


def _model(remat="none", dtype="float32"):
    # 8 heads so that tensor=8 splits them; scanned layers; dropout on.
    config = preset("tiny", vocab_size=V, num_heads=8, max_position_embeddings=64,
                    scan_layers=True, remat=remat, dtype=dtype)
    return BertForPretraining(config)


def _batch():
    rng = np.random.default_rng(0)
    lengths = rng.integers(L // 2, L + 1, B)
    mask = (np.arange(L)[None] < lengths[:, None]).astype(np.int32)
    return {"input_ids": (rng.integers(5, V, (B, L)) * mask).astype(np.int32),
            "segment_ids": (np.arange(L)[None] >= lengths[:, None] // 2).astype(np.int32),
            "input_mask": mask,
            "masked_positions": rng.integers(1, L // 2, (B, PRED)).astype(np.int32),
            "masked_ids": rng.integers(5, V, (B, PRED)).astype(np.int32),
            "masked_weights": np.ones((B, PRED), np.float32),
            "nsp_label": rng.integers(0, 2, B).astype(np.int32)}


def _train(model, mesh, start=None, batch=None):
    """(initial state, final state, per-step metrics) of STEPS steps on a fixed batch.

    The state is initialized on `mesh`, or, given `start` (a state on another mesh), placed from
    it in the shardings the rules give: an initialization costs a compile of its own, and
    test_step.py checks that a sharded one equals the one-device one.
    """
    batch = _batch() if batch is None else batch
    shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch.items()}
    optimizer = make_optimizer(OPTIMIZER)
    if start is None:
        state, shardings = create_train_state(model, optimizer, shapes, mesh, seed=0)
    else:
        _, shardings = abstract_train_state(model, optimizer, shapes, mesh, seed=0)
        state = jax.device_put(jax.device_get(start), shardings)  # fresh buffers: donated below
    initial = jax.tree.map(lambda x: x.copy(), state)
    global_batch = partitioning.global_batch(batch, mesh)
    step = make_train_step(model, optimizer, mesh, shardings).lower(state, global_batch).compile(
        compiler_options=FAST_COMPILE)
    metrics = []
    for _ in range(STEPS):
        state, m = step(state, global_batch)
        metrics.append(jax.device_get(m))
    return {"initial": initial, "final": state, "metrics": metrics, "batch": global_batch}


@pytest.fixture(scope="module")
def single():
    return _train(_model(), make_mesh(1, 1, 1, devices=jax.devices()[:1]))


def _close(got, want, rtol=1e-5, atol=1e-6):
    jax.tree.map(lambda a, b: np.testing.assert_allclose(np.asarray(a), np.asarray(b),
                                                         rtol=rtol, atol=atol), got, want)


def _spec(mesh, *axes):
    """The PartitionSpec the rules give a parameter when every named axis shards; axes of size 1
    (not sharding anything) come out as None."""
    return P(*(a if a is not None and mesh.shape[a] > 1 else None for a in axes))


@pytest.mark.parametrize("name", MESHES)
@pytest.mark.slow
def test_sharded_step_matches_one_device_and_arrays_are_sharded_as_the_rules_say(name, single):
    sizes, remat = MESHES[name]
    mesh = make_mesh(*sizes)
    run = _train(_model(remat=remat), mesh, start=single["initial"])

    _close(run["initial"].params, single["initial"].params, rtol=0, atol=0)
    for got, want in zip(run["metrics"], single["metrics"]):
        assert set(got) == set(want)
        _close(got, want)
    # Adam divides by sqrt(v): near-cancelling gradient sums (added in another order on another
    # mesh) move a parameter by lr * O(relative rounding), hence an lr-scaled atol.
    _close(run["final"].params, single["final"].params, atol=1e-5)
    _close(run["final"].opt_state, single["final"].opt_state, atol=1e-6)

    t, f = mesh.shape["tensor"], mesh.shape["fsdp"]
    for state in (run["initial"], run["final"]):  # the step keeps the layout it was given
        params = state.params
        word = params["encoder"]["embeddings"]["word_embeddings"]
        layers = params["encoder"]["layers"]
        expected = {
            "word embeddings": (word, _spec(mesh, "tensor", "fsdp"), (V // t, 128 // f)),
            "query kernel": (layers["attention"]["query"]["kernel"],
                             _spec(mesh, None, "fsdp", "tensor", None), (2, 128 // f, 8 // t, 16)),
            "attention output kernel": (layers["attention"]["output"]["kernel"],
                                        _spec(mesh, None, "tensor", None, "fsdp"),
                                        (2, 8 // t, 16, 128 // f)),
            "intermediate kernel": (layers["intermediate"]["kernel"],
                                    _spec(mesh, None, "fsdp", "tensor"), (2, 128 // f, 512 // t)),
            "intermediate bias": (layers["intermediate"]["bias"], _spec(mesh, None, "tensor"),
                                  (2, 512 // t)),
            "layer norm scale": (layers["output_norm"]["scale"], P(None, None), (2, 128)),
            "mlm bias": (params["mlm"]["bias"], _spec(mesh, "tensor"), (V // t,)),
        }
        for what, (array, spec, shard_shape) in expected.items():
            assert array.sharding.spec == spec, what
            assert all(s.data.shape == shard_shape for s in array.addressable_shards), what
            assert len(array.addressable_shards) == 8, what
        # Adam's moments are laid out like their parameters; its counter is replicated.
        adam = state.opt_state[1]
        for moments in (adam.mu, adam.nu):
            assert moments["encoder"]["embeddings"]["word_embeddings"].sharding.spec == \
                word.sharding.spec
            assert moments["encoder"]["layers"]["attention"]["query"]["kernel"].sharding.spec \
                == layers["attention"]["query"]["kernel"].sharding.spec
        assert adam.count.sharding.spec == P()
        assert state.step.sharding.spec == P()
    inputs = run["batch"]["input_ids"]
    assert inputs.sharding.spec == P(("data", "fsdp"))
    assert inputs.addressable_shards[0].data.shape == (B // (mesh.shape["data"] * f), L)


@pytest.mark.slow
def test_bf16_compute_keeps_fp32_master_parameters_and_stays_close(single):
    run = _train(_model(dtype="bfloat16"), make_mesh(2, 2, 2), start=single["initial"])
    leaves = jax.tree.leaves((run["final"].params, run["final"].opt_state[1].mu,
                              run["final"].opt_state[1].nu))
    assert leaves and all(leaf.dtype == jnp.float32 for leaf in leaves)
    for got, want in zip(run["metrics"], single["metrics"]):
        # bf16 matmuls (8-bit mantissa) with fp32 softmax, LayerNorm and loss: about 1% off.
        assert float(got["loss"]) == pytest.approx(float(want["loss"]), rel=2e-2)
        assert float(got["mlm_weight"]) == float(want["mlm_weight"])
    # LayerNorm scales start at 1.0, where bf16's spacing is 2^-7 and the two updates add up to
    # about 4e-3: fp32 masters keep values a bf16 copy could not hold.
    scale = np.asarray(run["final"].params["encoder"]["layers"]["output_norm"]["scale"])
    assert np.any(scale != scale.astype(jnp.bfloat16).astype(np.float32))


@pytest.mark.slow
def test_seeds_share_one_initialization_program_and_give_different_parameters():
    """The seed's key is an argument of the compiled initialization, not a constant: restarts
    and a benchmark's seeds compile it once between them."""
    mesh = make_mesh(2, 2, 2)
    shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in _batch().items()}
    plans = [StatePlan(_model(), make_optimizer(OPTIMIZER), shapes, mesh, seed) for seed in (0, 1)]
    assert plans[0].init_program().as_text() == plans[1].init_program().as_text()
    first, second = (jax.device_get(plan.create().params) for plan in plans)
    assert all(not np.array_equal(a, b) for a, b in zip(jax.tree.leaves(first),
                                                        jax.tree.leaves(second)) if np.std(a) > 0)


def test_process_batch_slice_of_one_process_is_the_whole_batch():
    assert partitioning.process_batch_slice(make_mesh(2, 2, 2)) == partitioning.BatchSlice(
        index=0, count=1, contiguous=True)


@pytest.mark.parametrize("rows_of, process, expected", [
    # 2 processes, data x fsdp = 8 shards over both: halves in process order.
    ({0: {0, 1, 2, 3}, 1: {4, 5, 6, 7}}, 1, (1, 2, True)),
    # A pod-like layout: each process's devices sit at every other batch shard.
    ({0: {0, 2}, 1: {1, 3}}, 1, (1, 2, False)),
    ({1: {0, 2}, 0: {1, 3}}, 0, (1, 2, False)),
    # Tensor parallelism across processes: both hold (and so feed) the whole batch.
    ({0: {0, 1}, 1: {0, 1}}, 1, (0, 1, True)),
    # 4 processes, replicated in pairs.
    ({0: {0}, 1: {0}, 2: {1}, 3: {1}}, 3, (1, 2, True)),
])
def test_slice_of_rows(rows_of, process, expected):
    got = partitioning.slice_of_rows(rows_of, process, shards=max(max(r) for r in
                                                                   rows_of.values()) + 1)
    assert (got.index, got.count, got.contiguous) == expected


def test_uneven_batch_layouts_are_refused():
    with pytest.raises(UserError, match="unequal or overlapping"):
        partitioning.slice_of_rows({0: {0, 1, 2}, 1: {3}}, 0, shards=4)
    with pytest.raises(UserError, match="unequal or overlapping"):
        partitioning.slice_of_rows({0: {0, 1}, 1: {1, 2}}, 0, shards=3)


REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# configs/platform.py preset: (devices, processes, accelerator?) of the platform it is for.
PLATFORMS = {"cpu": (1, 1, False), "cpu_bf16": (1, 1, False), "tpu_v4_8": (4, 1, True),
             "tpu_v5e_8": (8, 1, True),
             "tpu_v4_32": (16, 4, True), "gpu_8": (8, 1, True)}


@pytest.mark.parametrize("name", PLATFORMS)
def test_platform_presets_fit_their_platform(name):
    devices, processes, accelerator = PLATFORMS[name]
    config = importlib.import_module("configs.platform").get_config(name)
    data, fsdp, tensor = resolve_axis_sizes(
        (config.mesh.data, config.mesh.fsdp, config.mesh.tensor), devices)
    batch = config.train.batch_size
    assert batch % (data * fsdp) == 0 and batch % processes == 0
    assert config.model.dtype == ("bfloat16" if accelerator else "float32")
    assert config.model.param_dtype == "float32"
    if name == "tpu_v4_32":
        assert (data, fsdp, tensor) == (4, 4, 1)
        # The same number of sequences as the paper's 1M steps of 256.
        assert batch * config.train.steps == 256 * 1_000_000


MODERN = dict(position_embedding="rope", rope_theta=160_000.0, norm="pre", mlp="geglu",
              use_bias=False, norm_bias=False, global_attention_every=3, sliding_window=8,
              type_vocab_size=0, layer_norm_eps=1e-5, hidden_dropout=0.0, attention_dropout=0.0)


@pytest.mark.slow
def test_a_modernbert_step_on_a_2x2x2_mesh_matches_one_device():
    """Rotary positions, GeGLU, pre-norm, scanned global and sliding-window layers (chosen per
    layer under lax.cond) and packed rows, sharded over data, fsdp and tensor at once."""
    config = preset("tiny", num_layers=3, vocab_size=V, num_heads=8, max_position_embeddings=64,
                    scan_layers=True, **MODERN)
    model = BertForPretraining(config, nsp=False)
    batch = {k: v for k, v in _batch().items() if k != "nsp_label"}
    half = L // 2  # two sequences a row: positions restart, pack ids split the row
    batch["pack_ids"] = np.broadcast_to((np.arange(L) >= half).astype(np.int32) + 1, (B, L)).copy()
    batch["positions"] = np.broadcast_to(np.arange(L) % half, (B, L)).astype(np.int32).copy()
    batch["segment_ids"] = np.zeros((B, L), np.int32)

    one = _train(model, make_mesh(1, 1, 1, devices=jax.devices()[:1]), batch=batch)
    mixed = _train(model, make_mesh(2, 2, 2), start=one["initial"], batch=batch)
    for got, want in zip(mixed["metrics"], one["metrics"]):
        _close(got, want)
    _close(mixed["final"].params, one["final"].params, atol=1e-5)
    kernel = mixed["final"].params["encoder"]["layers"]["intermediate"]["kernel"]
    assert kernel.sharding.spec == P(None, "fsdp", "tensor") and kernel.shape == (3, 128, 512)
