"""model.matmul_dtype: bf16 operands with fp32 results in every dense layer and the tied output
layer, while activations, GELU, softmax and LayerNorm stay fp32. Checked on the traced program
(which dot_generals take which operands) and on the numbers (close to fp32, not equal to it)."""

import jax
import jax.extend
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.cli import main
from bertjax.model.config import preset
from bertjax.model.heads import BertForPretraining


def tiny(**changes):
    return preset("tiny", vocab_size=100, hidden_dropout=0.0, attention_dropout=0.0, **changes)


def inputs():
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 100, (2, 16)).astype(np.int32)
    mask = np.ones_like(ids)
    return {"input_ids": ids, "segment_ids": np.zeros_like(ids), "input_mask": mask,
            "masked_positions": np.array([[1, 4, 7], [2, 3, 9]], np.int32)}


def forward(config, params=None):
    model = BertForPretraining(config, nsp=True)
    batch = inputs()
    if params is None:
        params = model.init(jax.random.PRNGKey(0), batch)
    return params, (lambda p: model.apply(p, batch))


def dots(function, params):
    """(operand dtypes, result dtype) of every dot_general the function traces, scans included."""
    found = []

    def walk(jaxpr):
        for eqn in jaxpr.eqns:
            if eqn.primitive.name == "dot_general":
                found.append((tuple(str(v.aval.dtype) for v in eqn.invars),
                              str(eqn.outvars[0].aval.dtype)))
            for sub in jax.extend.core.jaxprs_in_params(eqn.params):
                walk(sub)

    walk(jax.make_jaxpr(function)(params).jaxpr)
    return found


@pytest.mark.slow
def test_bf16_operands_fp32_results_in_the_dense_layers_and_the_output_layer():
    params, apply = forward(tiny(matmul_dtype="bfloat16"))
    found = dots(apply, params)
    bf16 = [d for d in found if d[0] == ("bfloat16", "bfloat16")]
    # Per layer: query, key, value, output, intermediate, output (6 x 2 layers, scanned once);
    # the pooler, the MLM transform and the tied output projection.
    assert len(bf16) >= 6 + 3, found
    assert all(result == "float32" for _, result in bf16), found
    # Attention's own products and the fp32 NSP head keep fp32 operands.
    assert any(d == (("float32", "float32"), "float32") for d in found), found


def test_default_is_plain_fp32():
    params, apply = forward(tiny())
    assert {d for d in dots(apply, params)} == {(("float32", "float32"), "float32")}


def test_outputs_are_bf16_close_to_fp32_and_differ_from_it():
    params, apply32 = forward(tiny())
    _, apply_mixed = forward(tiny(matmul_dtype="bfloat16"), params)
    exact, mixed = apply32(params), apply_mixed(params)
    for name in ("mlm_logits", "nsp_logits"):
        a, b = np.asarray(exact[name]), np.asarray(mixed[name])
        assert b.dtype == np.float32
        scale = np.abs(a).max()
        assert np.abs(a - b).max() <= 2e-2 * scale, name
        assert not np.array_equal(a, b), name  # the bf16 operands are really used


def test_gradients_flow_in_fp32_params():
    params, apply = forward(tiny(matmul_dtype="bfloat16"))
    grads = jax.jit(jax.grad(lambda p: jnp.sum(apply(p)["mlm_logits"] ** 2)))(params)
    leaves = jax.tree_util.tree_leaves(grads)
    assert all(g.dtype == jnp.float32 for g in leaves)
    leaves = [np.asarray(g) for g in leaves]
    assert all(np.isfinite(g).all() for g in leaves)
    assert sum(float(np.abs(g).sum()) for g in leaves) > 0


def test_an_unknown_matmul_dtype_is_refused_in_one_line(tmp_path, capsys):
    workdir = tmp_path / "run"
    argv = ["bertjax.cli.main", "--config=configs/tiny.py", f"--workdir={workdir}",
            "--config.model.matmul_dtype=int8"]
    assert main.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "model.matmul_dtype" in err[0], err
    assert not workdir.exists()
