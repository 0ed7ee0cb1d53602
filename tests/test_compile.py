"""`python -m bertjax.compile`: the real train step compiled for TPU slices by libtpu on this CPU
(libtpu is in the test extra): slice names, the report's figures (FLOPs of scanned and unrolled
steps against the analytic count, memory, collectives), refusals (a batch that does not fit, an
unknown slice, no libtpu), and collectives counted per loop iteration in HLO text."""

import importlib.util
import types

import pytest

import cli_in_process
from bertjax.aot import hlo, topology
from bertjax.cli import compile as compile_cli
from bertjax.core.errors import UserError
from bertjax.settings import pretrain as pretrain_settings
from configs import tiny

pytestmark = pytest.mark.skipif(importlib.util.find_spec("libtpu") is None,
                                reason="libtpu missing: pip install -e '.[test]'")


def tiny_settings(**model):
    """configs/tiny.py, one 64-token phase, bf16, no dropout: dropout's random bits are
    elementwise work XLA counts as FLOPs, which the analytic (matmul) count leaves out."""
    config = tiny.get_config()
    config.schedule.long_fraction = 0.0
    config.model.dtype = "bfloat16"
    config.model.hidden_dropout = config.model.attention_dropout = 0.0
    for key, value in model.items():
        config.model[key] = value
    return pretrain_settings.read(config)


def compiled_report(slice_name: str, **model) -> dict:
    options = types.SimpleNamespace(config="configs/tiny.py", num_slices=1)
    return compile_cli.run(options, topology.parse(slice_name), tiny_settings(**model))


@pytest.mark.parametrize("name, chips, libtpu_name, accelerator", [
    ("v4-8", 4, "v4:2x2x1", "v4-8"), ("v4-32", 16, "v4:2x2x4", "v4-32"),
    ("v5e-8", 8, "v5e:2x4", "v5litepod-8"), ("v5litepod-256", 256, "v5e:16x16", "v5litepod-256"),
    ("v5p-128", 64, "v5p:4x4x4", "v5p-128"), ("V6E-8", 8, "v6e:2x4", "v6e-8")])
def test_slice_names_count_cores_for_v4_v5p_and_chips_for_v5e_v6e(name, chips, libtpu_name,
                                                                   accelerator):
    slice_ = topology.parse(name)
    assert (slice_.chips, slice_.libtpu_name, slice_.accelerator_type) == (
        chips, libtpu_name, accelerator)


def test_libtpu_describes_one_device_a_chip():
    assert len(topology.devices(topology.parse("v4-8"))) == 4  # megacore: 2 cores, 1 device
    devices = topology.devices(topology.parse("v5e-8"), num_slices=2)
    assert len(devices) == 16 and {d.slice_index for d in devices} == {0, 1}


def test_unknown_slice_and_missing_libtpu_are_refused_by_name(monkeypatch):
    with pytest.raises(UserError, match="unknown TPU topology 'v4-7'; known: v4-8, v4-16"):
        topology.parse("v4-7")
    monkeypatch.setattr(topology.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(UserError, match=r"^libtpu is not installed: pip install 'bertjax\[tpu\]'"):
        topology.devices(topology.parse("v5e-8"))


def check_report(report: dict, chips: int) -> dict:
    assert report["chips"] == chips and len(report["phases"]) == 1
    phase = report["phases"][0]
    memory = phase["memory_bytes"]
    assert min(memory["arguments"], memory["outputs"], memory["temporaries"]) > 0
    assert memory["total"] == (memory["arguments"] + memory["outputs"] - memory["donated"]
                               + memory["temporaries"])
    assert 0 < memory["total"] < phase["hbm_bytes"]
    # Data parallelism: the gradients are all-reduced, every parameter's bytes at least.
    assert phase["collectives"]["all-reduce"]["count"] >= 1
    assert phase["collectives"]["all-reduce"]["bytes"] >= 2 * 1_000_000
    assert phase["bytes_accessed"] > 0 and phase["uncounted_loops"] == 0
    roofline = phase["roofline"]
    assert roofline["step_s_lower_bound"] == max(roofline["compute_s"], roofline["hbm_s"],
                                                 roofline["ici_s"]) > 0
    assert 0 < roofline["mfu_ceiling"] <= 1
    return phase


def test_scanned_and_unrolled_steps_report_the_same_flops_near_the_analytic_count():
    # 3 layers: the scanned step's count is extrapolated from 1- and 2-layer variants.
    scanned = check_report(compiled_report("v5e-8", scan_layers=True, num_layers=3), 8)
    unrolled = check_report(compiled_report("v5e-8", scan_layers=False, num_layers=3), 8)
    assert "variants" in scanned["flops_method"] and "no loops" in unrolled["flops_method"]
    # XLA counts the scanned layers' body once; the extrapolated count matches the unrolled one.
    assert scanned["xla_flops_loop_bodies_once"] < 0.9 * unrolled["flops"]
    assert scanned["flops"] == pytest.approx(unrolled["flops"], rel=0.02)
    analytic = unrolled["model_flops_step_all_chips"] / 8
    # XLA's count adds elementwise work (softmax, GELU, LayerNorm, Adam) to the matmuls the
    # analytic count has: 12% at H=128 (tiny), 3.7% at H=512 (measured; slower to compile).
    for phase in (scanned, unrolled):
        assert 1.0 < phase["flops"] / analytic < 1.15


def test_v4_slice_report():
    phase = check_report(compiled_report("v4-8", scan_layers=False), 4)
    assert 1.0 < phase["flops"] / (phase["model_flops_step_all_chips"] / 4) < 1.3


def test_a_batch_that_does_not_fit_a_chip_is_refused_in_one_line():
    result = cli_in_process.run("bertjax.cli.compile", "--config=configs/tiny.py",
                                "--topology=v5e-8", "--config.schedule.long_fraction=0",
                                "--config.train.batch_size=1048576")
    assert result.returncode == 2, result.stderr
    line, = result.stderr.strip().splitlines()
    assert "train step at 64 tokens needs" in line and "GiB per device but a device holds" in line
    assert "lower train.batch_size" in line


@pytest.mark.parametrize("args, message", [
    (["--topology=v9-8"], "unknown TPU topology 'v9-8'"),
    ([], "the following arguments are required: --topology"),
    (["--topology=v5e-8", "--num-slices=0"], "--num-slices must be at least 1"),
])
def test_bad_flags_are_refused_in_one_line(args, message):
    result = cli_in_process.run("bertjax.cli.compile", "--config=configs/tiny.py", *args)
    assert result.returncode == 2 and message in result.stderr, result.stderr
    assert len(result.stderr.strip().splitlines()) == 1


HLO = """HloModule m

%add (a: f32[], b: f32[]) -> f32[] {
  ROOT %s = f32[] add(f32[] %a, f32[] %b)
}

%cond (p: (s32[], f32[4])) -> pred[] {
  %p = (s32[], f32[4]) parameter(0)
  %i = s32[] get-tuple-element(%p), index=0
  %n = s32[]{:T(128)} constant(3)
  ROOT %lt = pred[] compare(%i, %n), direction=LT
}

%body (p: (s32[], f32[4])) -> (s32[], f32[4]) {
  %p = (s32[], f32[4]) parameter(0)
  %x = f32[4]{0:T(256)} get-tuple-element(%p), index=1
  %r = f32[4]{0:T(256)} all-reduce(%x), replica_groups={}, to_apply=%add
  ROOT %t = (s32[], f32[4]) tuple(%i, %r)
}

ENTRY %main (a: f32[4], b: bf16[2,8]) -> f32[4] {
  %w = (s32[], f32[4]) while(%init), condition=%cond, body=%body
  %g = (bf16[2,8], bf16[4,8]) all-gather-start(%b), dimensions={0}
  %d = bf16[4,8]{1,0} all-gather-done(%g)
  ROOT %o = f32[4] get-tuple-element(%w), index=1
}
"""


def test_collectives_in_a_loop_body_count_once_per_iteration():
    found = hlo.collectives(HLO)
    assert found.count["all-reduce"] == 3 and found.bytes["all-reduce"] == 3 * 16
    assert found.count["all-gather"] == 1 and found.bytes["all-gather"] == 4 * 8 * 2
    assert found.total_bytes == 48 + 64 and found.uncounted_loops == 0
