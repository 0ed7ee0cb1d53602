"""Attention kernels by platform (bertjax/model/attention_choice.py): which kernel each layer
kind gets, Pallas splash attention in Pallas's interpreter against the XLA path (forward and
gradients; padding, packed rows, sliding windows and all three), and the TPU compile report
naming the kernel it found in the HLO.

Tolerances, outputs and gradients of one attention (inputs standard normal, gradients up to
about 3): fp32 1e-5 absolute (measured below 1e-6); bf16 4e-2 absolute, two bf16 ulps at the
gradients' magnitude (both paths round their bf16 products, in different orders). Rows of
padding queries are left out: there the XLA path averages every key and the kernel the padding.
"""

import types

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.aot import attention_report, hlo, topology
from bertjax.cli import compile as compile_cli
from bertjax.cli import main
from bertjax.core.errors import UserError
from bertjax.model import attention_choice, local_attention, splash_attention
from bertjax.model.attention import attention
from bertjax.model.config import preset
from bertjax.model.encoder import Encoder
from bertjax.settings import pretrain as pretrain_settings
from configs import modernbert
from configs import tiny as tiny_config

TOLERANCE = {jnp.float32: 1e-5, jnp.bfloat16: 4e-2}


def tiny(**changes):
    return preset("tiny", **{"vocab_size": 100, "hidden_dropout": 0.0, "attention_dropout": 0.0,
                             **changes})


# -- which kernel ---------------------------------------------------------------------------

@pytest.mark.parametrize("requested, platform, dtype, packed, expected", [
    ("auto", "tpu", "bfloat16", True, ("splash", "splash")),
    ("auto", "tpu", "float32", False, ("splash", "splash")),
    ("auto", "gpu", "bfloat16", False, ("cudnn", "xla")),  # cuDNN: no two-sided window
    ("auto", "gpu", "bfloat16", True, ("xla", "xla")),  # nor segment ids
    ("auto", "gpu", "float32", False, ("xla", "xla")),  # nor fp32
    ("auto", "cpu", "bfloat16", False, ("xla", "xla")),
    ("", "tpu", "float32", False, ("splash", "splash")),  # a record's "": auto
    ("xla", "tpu", "bfloat16", False, ("xla", "xla")),
    ("splash", "cpu", "float32", True, ("splash", "splash")),
    ("cudnn", "gpu", "bfloat16", True, ("xla", "xla")),
    ("explicit", "tpu", "bfloat16", False, ("explicit", "explicit")),
])
def test_each_layer_kind_gets_the_platforms_kernel(requested, platform, dtype, packed, expected):
    config = tiny(attention_implementation=requested, dtype=dtype, sliding_window=8,
                  global_attention_every=2)
    chosen = attention_choice.choices(config, platform=platform, training=True, packed=packed)
    assert chosen == dict(zip(("global", "sliding_window"), expected))


def test_attention_dropout_in_training_spells_the_probabilities_out_under_auto():
    config = tiny(attention_dropout=0.1)
    assert attention_choice.choices(config, platform="tpu", training=True, packed=False) == {
        "global": "explicit"}
    assert attention_choice.choices(config, platform="tpu", training=False, packed=False) == {
        "global": "splash"}


def test_splash_with_attention_dropout_is_one_line_and_exit_2(tmp_path, capsys):
    argv = ["bertjax.cli.main", "--config=configs/tiny.py", f"--workdir={tmp_path / 'wd'}",
            "--config.model.attention_implementation=splash",
            "--config.model.attention_dropout=0.1"]
    assert main.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "no attention probabilities to drop" in err[0], err
    assert not (tmp_path / "wd").exists()


def test_cudnn_with_attention_dropout_is_refused():
    # Off a GPU the CLI refuses cuDNN before this (test_attention_path.py); the model refuses
    # the pair on any platform.
    with pytest.raises(UserError, match="no attention probabilities to drop"):
        tiny(attention_implementation="cudnn", attention_dropout=0.1)


def test_padding_gets_a_segment_id_no_real_token_has():
    key_mask = jnp.array([[True, True, True, False], [True, True, False, False]])
    pack_ids = jnp.array([[0, 0, 1, 0], [3, 3, 0, 0]])
    np.testing.assert_array_equal(splash_attention.segment_ids(key_mask, pack_ids),
                                  [[1, 1, 2, 0], [4, 4, 0, 0]])
    np.testing.assert_array_equal(splash_attention.segment_ids(key_mask, None),
                                  [[1, 1, 1, 0], [1, 1, 0, 0]])


@pytest.mark.parametrize("length, window, padded, block", [
    (40, None, 128, 128), (512, None, 512, 512), (640, None, 640, 128), (1000, None, 1024, 512),
    (8192, 64, 8192, 128), (300, 64, 384, 128)])
def test_rows_pad_to_whole_blocks_of_128(length, window, padded, block):
    assert splash_attention.padded_length(length) == padded
    assert splash_attention.block_size(length, window) == block


def test_the_report_reads_the_kernels_off_the_hlo():
    text = "\n".join([
        '  %splash_mha_fwd_segmented_residuals.2 = (f32[128,128]) custom-call(%a), '
        'custom_call_target="tpu_custom_call", backend_config="x"',
        '  %splash_mha_fwd_segmented_residuals = (f32[128,128]) custom-call(%b), '
        'custom_call_target="tpu_custom_call"',
        '  ROOT %splash_mha_dq_segmented_no_residuals.7 = f32[1] custom-call(%c), '
        'custom_call_target="tpu_custom_call"',
        '  %cudnn.1 = f32[1] custom-call(%d), custom_call_target="__cudnn$fmhaSoftmax"'])
    assert attention_report.tpu_kernels(text) == {"splash_mha_dq_segmented_no_residuals": 1,
                                                 "splash_mha_fwd_segmented_residuals": 2}
    config = tiny(sliding_window=8, global_attention_every=3)
    found = attention_report.attention_report(config, "tpu", packed=True, phases=[(128, text)])
    assert found["layers"] == {"global": "splash", "sliding_window": "splash"}
    assert found["splash_in_hlo"] is True
    line = attention_report.describe(found)
    assert "global splash, sliding_window splash" in line and "splash_mha_dq" in line
    missing = attention_report.attention_report(config, "tpu", packed=True, phases=[(128, "")])
    assert "NO splash kernel" in attention_report.describe(missing)
    on_cpu = attention_report.attention_report(config, "cpu", packed=True, phases=[(128, "")])
    assert on_cpu["splash_in_hlo"] is None


def test_the_hlo_reader_reads_past_a_custom_call_whose_config_wraps_lines():
    """A Pallas call's backend config holds text that wraps onto a line starting "}}": the ops
    after it (here a dot of 2 x 4 x 8 x 16 FLOPs) still belong to the computation."""
    text = "\n".join([
        "HloModule m", "",
        "ENTRY %main (p: f32[4,8], q: f32[8,16]) -> f32[4,16] {",
        "  %p = f32[4,8]{1,0} parameter(0)",
        "  %q = f32[8,16]{1,0} parameter(1)",
        '  %splash_mha_fwd.1 = f32[4,8]{1,0} custom-call(%p), custom_call_target="tpu_custom_call",'
        ' backend_config={"xprof_metadata":"{\\"block_q\\": 128,',
        '}}, metadata={op_name="pallas_call"}',
        "  ROOT %dot.2 = f32[4,16]{1,0} dot(%splash_mha_fwd.1, %q), lhs_contracting_dims={1}, "
        "rhs_contracting_dims={0}",
        "}"])
    assert hlo.analyse(text).matmul_flops == 2 * 4 * 8 * 16
    assert attention_report.tpu_kernels(text) == {"splash_mha_fwd": 1}


# -- the kernel against the XLA path, in Pallas's interpreter ----------------------------------

def _inputs(length: int, dtype, padded: bool, packed: bool):
    rng = np.random.default_rng(length)
    batch, heads, dim = 2, 2, 16
    q, k, v, cotangent = (jnp.asarray(rng.normal(size=(batch, length, heads, dim)), dtype)
                          for _ in range(4))
    lengths = np.array([[length], [length * 2 // 3 if padded else length]])
    key_mask = jnp.asarray(np.arange(length)[None] < lengths)
    starts = np.array([[length // 3], [length // 4]])
    pack_ids = (jnp.asarray((np.arange(length)[None] >= starts).astype(np.int32))
                if packed else None)
    return q, k, v, cotangent * key_mask[:, :, None, None], key_mask, pack_ids


def _xla(q, k, v, key_mask, pack_ids, half_window):
    if half_window is not None:
        return local_attention.sliding_window_attention(q, k, v, key_mask, half_window,
                                                        pack_ids=pack_ids)
    mask = key_mask[:, None, None, :]
    if pack_ids is not None:
        mask = mask & (pack_ids[:, :, None] == pack_ids[:, None, :])[:, None]
    return attention(q, k, v, mask, implementation="xla")


CASES = {  # name: (length, half window, padding, packed rows, dtype)
    "padding": (40, None, True, False, jnp.float32),
    "packed": (40, None, False, True, jnp.float32),
    "window": (200, 16, False, False, jnp.float32),
    "all three": (200, 16, True, True, jnp.float32),
    "global, padded and packed": (40, None, True, True, jnp.float32),
    "all three, bf16": (200, 16, True, True, jnp.bfloat16),
    "global, padded and packed, bf16": (40, None, True, True, jnp.bfloat16),
}


@pytest.mark.slow  # Pallas's interpreter: ~10 s a case
@pytest.mark.parametrize("case", list(CASES))
def test_splash_matches_xla_forward_and_gradients(case):
    length, half, padded, packed, dtype = CASES[case]
    q, k, v, cotangent, key_mask, pack_ids = _inputs(length, dtype, padded, packed)
    fused, fused_vjp = jax.vjp(lambda *a: splash_attention.splash_attention(
        *a, key_mask, pack_ids, half_window=half, interpret=True), q, k, v)
    plain, plain_vjp = jax.vjp(lambda *a: _xla(*a, key_mask, pack_ids, half), q, k, v)
    real = np.asarray(key_mask)
    f32 = lambda x: np.asarray(x, np.float32)  # noqa: E731
    np.testing.assert_allclose(f32(fused)[real], f32(plain)[real], rtol=0, atol=TOLERANCE[dtype])
    for name, a, b in zip("qkv", fused_vjp(cotangent), plain_vjp(cotangent)):
        np.testing.assert_allclose(f32(a), f32(b), rtol=0, atol=TOLERANCE[dtype], err_msg=name)


@pytest.mark.slow  # the kernel in Pallas's interpreter under nn.scan and lax.cond
def test_an_encoder_of_global_and_window_layers_trains_the_same_through_splash():
    """ModernBERT's layout (rotary, every other layer a window, scanned layers under lax.cond),
    padded and packed rows: the splash encoder's output and parameter gradients are the XLA
    encoder's, in fp32."""
    rng = np.random.default_rng(0)
    length = 160
    ids = jnp.asarray(rng.integers(5, 100, (2, length)), jnp.int32)
    segments = jnp.zeros_like(ids)
    mask = jnp.asarray(np.arange(length)[None] < np.array([[length], [100]]), jnp.int32)
    pack_ids = jnp.asarray((np.arange(length)[None] >= np.array([[70], [40]])).astype(np.int32))
    positions = jnp.where(pack_ids == 0, jnp.arange(length), jnp.arange(length) - jnp.array(
        [[70], [40]]))
    architecture = dict(position_embedding="rope", norm="pre", mlp="geglu", use_bias=False,
                        norm_bias=False, global_attention_every=2, sliding_window=32,
                        type_vocab_size=0, num_layers=2, scan_layers=True)

    def loss_and_grads(kernel):
        model = Encoder(tiny(attention_implementation=kernel, **architecture))
        params = model.init(jax.random.PRNGKey(0), ids, segments, mask)

        def loss(p):
            out = model.apply(p, ids, segments, mask, positions=positions, pack_ids=pack_ids)
            return jnp.sum(out.sequence * mask[..., None] * jnp.cos(jnp.arange(128.0)))
        return jax.value_and_grad(loss)(params)

    (fused, fused_grads), (plain, plain_grads) = loss_and_grads("splash"), loss_and_grads("xla")
    np.testing.assert_allclose(fused, plain, rtol=1e-5)
    for a, b in zip(jax.tree.leaves(fused_grads), jax.tree.leaves(plain_grads)):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


# -- the TPU compile report --------------------------------------------------------------------

@pytest.mark.tpu_compile
def test_a_modernbert_step_compiled_for_v5e_runs_splash_in_both_layer_kinds():
    """Compiled on this CPU for a v5e-8 (rows over 4 data shards, heads over 2 tensor shards):
    auto follows the target's platform, not the host's, and the HLO holds the kernel."""
    config = tiny_config.get_config()
    modernbert.set_architecture(config)
    config.model.num_layers, config.model.sliding_window = 3, 64
    config.objective = "roberta"
    config.data.separate_documents = True
    config.schedule.long_fraction = 0.0
    config.schedule.short_seq_len, config.schedule.short_max_predictions = 128, 20
    config.train.batch_size, config.model.dtype = 8, "bfloat16"
    config.mesh.data, config.mesh.tensor = 4, 2
    s = pretrain_settings.read(config)
    options = types.SimpleNamespace(config="configs/tiny.py", num_slices=1)
    result = compile_cli.run(options, topology.parse("v5e-8"), s)
    found = result["attention"]
    assert found["layers"] == {"global": "splash", "sliding_window": "splash"}
    assert found["splash_in_hlo"] is True
    kernels = found["phases"][0]["tpu_kernels"]
    assert {name.split("_segmented")[0] for name in kernels} == {
        "splash_mha_fwd", "splash_mha_dq", "splash_mha_dkv"}
    assert "tpu_custom_call splash_mha_dkv" in attention_report.describe(found)
