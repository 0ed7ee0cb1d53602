"""bertjax.model.low_precision_matmul: the bf16 product whose weight gradient XLA's CPU backend
keeps on its bf16 kernels. Its value and gradients are autodiff's (of the cast product) within
bf16 rounding; compiled on the CPU, no product in the backward pass is widened to fp32; and the
encoder takes it with model.matmul_dtype=bfloat16 and gives autodiff's gradients."""

import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.cli import main
from bertjax.model import low_precision_matmul
from bertjax.model.config import preset
from bertjax.model.heads import BertForPretraining
from bertjax.train.metrics_log import read_metrics
from pretrain_runs import tiny_args
import run_devices

BF16 = "bfloat16"


def cast_product(x, w):
    """What autodiff differentiates without the custom rule."""
    return jnp.dot(x.astype(BF16), w.astype(BF16), preferred_element_type=jnp.float32)


def loss_of(product):
    def loss(x, w, target):
        return jnp.sum(jnp.tanh(product(x, w)) * target)
    return loss


@pytest.fixture
def operands():
    rng = np.random.default_rng(0)
    return (jnp.asarray(rng.standard_normal((48, 32)), jnp.float32),
            jnp.asarray(rng.standard_normal((32, 24)) * 0.2, jnp.float32),
            jnp.asarray(rng.standard_normal((48, 24)), jnp.float32))


def fast(x, w):
    return low_precision_matmul.matmul_2d(x, w, BF16, "float32")


def fast_transposed(x, w_stored):
    """The tied-output form: the kernel stored [N, K]."""
    return low_precision_matmul.matmul_2d(x, w_stored, BF16, "float32", True)


@pytest.mark.parametrize("transposed", [False, True])
def test_value_and_gradients_are_autodiffs_of_the_cast_product(operands, transposed):
    x, w, target = operands
    if transposed:  # the same product, its kernel stored the other way round
        product, stored, back = fast_transposed, jnp.asarray(np.asarray(w).T), lambda g: g.T
    else:
        product, stored, back = fast, w, lambda g: g
    np.testing.assert_array_equal(np.asarray(product(x, stored)), np.asarray(cast_product(x, w)))
    gx, gw = jax.grad(loss_of(product), argnums=(0, 1))(x, stored, target)
    ours = (gx, back(gw))
    reference = jax.grad(loss_of(cast_product), argnums=(0, 1))(x, w, target)
    exact = jax.grad(loss_of(lambda a, b: a @ b), argnums=(0, 1))(x, w, target)
    for mine, theirs, fp32 in zip(ours, reference, exact):
        assert mine.dtype == jnp.float32  # the fp32 inputs get fp32 gradients
        scale = float(jnp.abs(theirs).max())
        # Only the cotangent's rounding to bf16 separates the two (autodiff keeps it fp32).
        assert float(jnp.abs(mine - theirs).max()) <= 1e-2 * scale
        assert float(jnp.abs(mine - fp32).max()) <= 3e-2 * scale


def test_bf16_inputs_get_bf16_gradients(operands):
    x, w, target = operands
    gx, gw = jax.grad(loss_of(fast), argnums=(0, 1))(x.astype(BF16), w.astype(BF16), target)
    assert gx.dtype == jnp.bfloat16 and gw.dtype == jnp.bfloat16


def widened_products(product, *args) -> list[str]:
    """The products in the compiled gradient program whose operands are fp32 (what XLA makes of a
    bf16 product it does not run on its bf16 kernels: converts to fp32 in front of it)."""
    text = jax.jit(jax.grad(loss_of(product), argnums=(0, 1))).lower(*args).compile().as_text()
    widened, products, types = [], 0, {}
    for line in text.splitlines():
        header = re.match(r"(?:ENTRY )?%\S+ \((.*)\) -> ", line)
        if header:  # a new computation: its names are its own
            types = dict(re.findall(r"([\w.-]+): (\w+)\[", header.group(1)))
            continue
        definition = re.match(r"\s*(?:ROOT )?%([\w.-]+) = (\w+)\[", line)
        if definition:
            types[definition.group(1)] = definition.group(2)
        product = re.search(r" dot\(([^)]*)\)", line)
        if product:
            products += 1
            names = [name.strip().lstrip("%") for name in product.group(1).split(",")]
            if any(types.get(name) == "f32" for name in names):
                widened.append(line.strip())
    assert products, "no product found in the compiled program"
    return widened


def test_the_compiled_backward_pass_keeps_every_product_in_bf16():
    assert jax.default_backend() == "cpu"
    rng = np.random.default_rng(1)
    # A BERT-base-sized product: large enough for XLA's bf16 kernels to take it.
    args = (jnp.asarray(rng.standard_normal((256, 768)), jnp.float32),
            jnp.asarray(rng.standard_normal((768, 512)), jnp.float32),
            jnp.ones((256, 512), jnp.float32))
    assert widened_products(fast, *args) == []
    x, w, target = args
    assert widened_products(fast_transposed, x, jnp.asarray(np.asarray(w).T), target) == []
    # The rule is needed: autodiff's own weight gradient is widened to fp32.
    assert widened_products(cast_product, *args) != []


def test_the_rule_is_for_bf16_on_the_cpu_only():
    assert low_precision_matmul.use_fast_gradients("bfloat16")
    assert not low_precision_matmul.use_fast_gradients("float32")


@pytest.mark.slow
def test_the_encoders_gradients_are_autodiffs(monkeypatch):
    config = preset("tiny", vocab_size=100, hidden_dropout=0.0, attention_dropout=0.0,
                    matmul_dtype=BF16)
    model = BertForPretraining(config, nsp=True)
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 100, (2, 16)).astype(np.int32)
    batch = {"input_ids": ids, "segment_ids": np.zeros_like(ids), "input_mask": np.ones_like(ids),
             "masked_positions": np.array([[1, 4, 7], [2, 3, 9]], np.int32)}
    params = model.init(jax.random.PRNGKey(0), batch)

    def gradients():
        def loss(p):
            out = model.apply(p, batch)
            return jnp.sum(out["mlm_logits"] ** 2) * 1e-3 + jnp.sum(out["nsp_logits"])
        # Compiled whole, as a train step is: XLA then rewrites across the products.
        return jax.jit(jax.grad(loss))(params)

    ours = gradients()
    monkeypatch.setattr(low_precision_matmul, "use_fast_gradients", lambda dtype: False)
    reference = gradients()
    paths = 0
    for (path, mine), theirs in zip(jax.tree_util.tree_leaves_with_path(ours),
                                    jax.tree_util.tree_leaves(reference)):
        assert mine.dtype == theirs.dtype == jnp.float32
        # The floor: the key bias's gradient is zero up to rounding (softmax ignores it).
        scale = max(float(jnp.abs(theirs).max()), 1e-6)
        assert float(jnp.abs(mine - theirs).max()) <= 3e-2 * scale, jax.tree_util.keystr(path)
        paths += 1
    assert paths > 20


@pytest.mark.slow
def test_a_pretraining_run_with_bf16_products_learns(tmp_path, small_corpus_dir):
    """configs/platform.py:cpu_bf16's model settings through the real job (data parallel over
    two of the test process's devices: tests/run_devices.py), across the length switch."""
    workdir = str(tmp_path / "run")
    argv = tiny_args(workdir, small_corpus_dir, **{
        "model.matmul_dtype": "bfloat16", "model.scan_layers": False,
        "optimizer.learning_rate": 2e-3, **run_devices.IN_A_WORKER})
    assert main.main(argv) == 0
    train = [r for r in read_metrics(workdir) if "loss" in r]
    assert [r["seq_len"] for r in train] == [32] * 8 + [64] * 4
    assert all(np.isfinite(r["loss"]) and np.isfinite(r["grad_norm"]) for r in train)
    first, last = (np.mean([r["mlm_loss"] for r in part]) for part in (train[:3], train[-3:]))
    assert last < first - 0.2  # measured: 6.9 -> 6.5 over these 12 steps
    assert os.path.isdir(os.path.join(workdir, "checkpoints", "12"))
