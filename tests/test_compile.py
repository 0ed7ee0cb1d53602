"""`python -m bertjax.compile`: the real train step compiled for TPU slices by libtpu on this CPU
(libtpu is the tpu extra; JAX_PLATFORMS=cpu, as conftest sets it): slice names, the report's
figures (matmul FLOPs counted in the HLO of scanned and unrolled steps against the analytic
count, memory, collectives), refusals (a batch that does not fit, an unknown slice, no libtpu),
and the HLO reader on hand-written HLO (loops, fusions, dots, convolutions, collectives)."""

import importlib.util
import json
import sys
import types

import pytest

import cli_in_process
from bertjax.aot import gpu, hlo, report, topology
from bertjax.cli import compile as compile_cli
from bertjax.core import atomic_files
from bertjax.core.errors import UserError
from bertjax.parallel.mesh import make_mesh
from bertjax.settings import pretrain as pretrain_settings
from configs import tiny

# Optimized: the reports must be those of the programs a user's `bertjax.compile` builds.
pytestmark = [pytest.mark.tpu_compile, pytest.mark.optimized]


# The smallest step that still has every part: configs/tiny.py (2 layers, H=128), one phase of
# 32 tokens, 8 sequences (one a chip on a v5e-8, two on a v4-8), bf16.
SMALL = ["--config.schedule.long_fraction=0", "--config.schedule.short_seq_len=32",
         "--config.schedule.short_max_predictions=5", "--config.train.batch_size=8",
         "--config.model.dtype=bfloat16"]


def tiny_settings(dropout: bool, **model):
    config = tiny.get_config()
    config.schedule.long_fraction = 0.0
    config.schedule.short_seq_len, config.schedule.short_max_predictions = 32, 5
    config.train.batch_size = 8
    config.model.dtype = "bfloat16"
    if not dropout:
        config.model.hidden_dropout = config.model.attention_dropout = 0.0
    for key, value in model.items():
        config.model[key] = value
    return pretrain_settings.read(config)


def compiled_report(slice_name: str, dropout: bool, **model) -> dict:
    options = types.SimpleNamespace(config="configs/tiny.py", num_slices=1)
    return compile_cli.run(options, topology.parse(slice_name), tiny_settings(dropout, **model))


@pytest.fixture(scope="module")
def scanned_on_v5e():
    """Layers scanned (one while loop over them), no dropout; XLA's attention, whose matmuls
    the HLO reader counts (the splash kernel's run inside a tpu_custom_call)."""
    return compiled_report("v5e-8", dropout=False, scan_layers=True,
                           attention_implementation="xla")


@pytest.fixture(scope="module")
def unrolled_on_v4():
    """Layers unrolled, dropout on (its random bits are elementwise work, no matmuls)."""
    return compiled_report("v4-8", dropout=True, scan_layers=False)


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
    # Two slices: only the data axis crosses the data-center network between them.
    mesh = make_mesh(-1, 2, 1, devices=devices)
    assert dict(mesh.shape) == {"data": 8, "fsdp": 2, "tensor": 1}
    by_data = mesh.devices.reshape(8, 2)
    for row in by_data:  # each fsdp pair sits on one slice
        assert len({d.slice_index for d in row}) == 1
    assert {d.slice_index for d in by_data[:4].flat} != {d.slice_index for d in by_data[4:].flat}
    with pytest.raises(UserError, match="multiple of the 2 slices"):
        make_mesh(1, 16, 1, devices=devices)


def test_unknown_slice_and_missing_libtpu_are_refused_by_name(monkeypatch):
    with pytest.raises(UserError, match="unknown topology 'v4-7'; known: v4-8, v4-16"):
        topology.parse("v4-7")
    monkeypatch.setitem(sys.modules, "libtpu", None)  # makes the import fail
    with pytest.raises(UserError, match=r"needs the tpu extra \(libtpu is not installed\): "
                                        r"pip install 'bertjax\[tpu\]'$"):
        topology.devices(topology.parse("v5e-8"))


def check_report(report: dict, chips: int) -> dict:
    assert report["chips"] == chips and len(report["phases"]) == 1
    phase = report["phases"][0]
    assert (phase["seq_len"], phase["batch"]) == (32, 8)
    memory = phase["memory_bytes"]
    assert min(memory["arguments"], memory["outputs"], memory["temporaries"]) > 0
    assert memory["total"] == (memory["arguments"] + memory["outputs"] - memory["donated"]
                               + memory["temporaries"])
    assert 0 < memory["total"] < phase["hbm_bytes"]
    # Data parallelism: the gradients are all-reduced, every parameter's bytes at least (tiny
    # has 1.3M parameters).
    assert phase["collectives"]["all-reduce"]["count"] >= 1
    assert phase["collectives"]["all-reduce"]["bytes"] >= 2 * 1_000_000
    assert phase["collective_bytes"] >= phase["collectives"]["all-reduce"]["bytes"]
    assert phase["bytes_accessed"] > 0 and phase["uncounted_loops"] == 0
    # The matmuls counted in the HLO are the analytic count's (model/flops.py): both count each
    # dot once, the MLM head at the masked positions only; no remat, so nothing recomputed.
    analytic = phase["model_flops_step_all_chips"] / chips
    assert phase["flops"] == pytest.approx(analytic, rel=0.05)
    roofline = phase["roofline"]
    assert roofline["step_s_lower_bound"] == max(roofline["compute_s"], roofline["hbm_s"],
                                                 roofline["ici_s"]) > 0
    assert 0 < roofline["mfu_ceiling"] <= 1 + 1e-9
    # The bound (true minima) is never slower than the estimate of the compiled program.
    bound, estimate = roofline["bound"], roofline["estimate"]
    assert bound["step_s"] == roofline["step_s_lower_bound"]
    assert bound["hbm_bytes"] <= estimate["hbm_bytes"] == phase["bytes_accessed"]
    assert bound["step_s"] <= estimate["step_s"] * (1 + 1e-9)
    assert 0 < estimate["mfu_estimate"] <= roofline["mfu_ceiling"] * (1 + 1e-9)
    assert sum(estimate["categories"].values()) == estimate["hbm_bytes"]
    assert estimate["top_fusions"] and estimate["top_fusions"][0]["bytes"] > 0
    assert roofline["tokens_per_s_ceiling"] == pytest.approx(
        8 * 32 / roofline["step_s_lower_bound"])
    return phase


def test_scanned_step_counts_every_layer(scanned_on_v5e):
    phase = check_report(scanned_on_v5e, 8)
    # Within 5% of the analytic count although the layers are one while loop, which XLA's own
    # count sees once.
    assert "scan_layers=True" in scanned_on_v5e["model"]
    assert phase["xla_flops_loop_bodies_once"] > 0


def test_unrolled_step_on_v4_with_dropout(unrolled_on_v4):
    phase = check_report(unrolled_on_v4, 4)
    assert unrolled_on_v4["device_kind"].startswith("TPU v4")
    # No loops: XLA's count is the matmuls plus elementwise work (softmax, GELU, LayerNorm,
    # dropout's random bits, Adam).
    assert phase["xla_flops_loop_bodies_once"] > phase["flops"]


def test_report_prints_and_saves(scanned_on_v5e, tmp_path):
    text = report.describe(scanned_on_v5e)
    assert "matmuls, from the HLO" in text
    assert "bound:" in text and "MFU ceiling" in text and "MFU estimate" in text
    atomic_files.write_json(str(tmp_path / "r.json"), scanned_on_v5e)
    assert json.loads((tmp_path / "r.json").read_text())["phases"][0]["flops"] > 0


def test_a_batch_that_does_not_fit_a_chip_is_refused_in_one_line():
    result = cli_in_process.run("bertjax.cli.compile", "--config=configs/tiny.py",
                                "--topology=v5e-8", *SMALL[:-2],
                                "--config.train.batch_size=4194304", "--config.train.fit=off")
    assert result.returncode == 2, result.stderr
    line, = result.stderr.strip().splitlines()
    assert "train step at 32 tokens needs" in line and "GiB per device but a device holds" in line
    assert "lower train.batch_size" in line


@pytest.mark.parametrize("args, message", [
    (["--topology=v9-8"], "unknown topology 'v9-8'"),
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

%fused_dot (param_0: f32[4,16], param_1: f32[16,8]) -> f32[4,8] {
  %param_0 = f32[4,16]{1,0} parameter(0)
  %param_1 = f32[16,8]{1,0} parameter(1)
  ROOT %dot.1 = f32[4,8]{1,0} dot(%param_0, %param_1), lhs_contracting_dims={1}, rhs_contracting_dims={0}
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
  %l = f32[4,16]{1,0} broadcast(%x), dimensions={0}
  %k = f32[16,8]{1,0} constant({...})
  %f = f32[4,8]{1,0} fusion(%l, %k), kind=kOutput, calls=%fused_dot
  ROOT %t = (s32[], f32[4]) tuple(%i, %r)
}

ENTRY %main (a: f32[4], b: bf16[2,8], c: bf16[2,64,256], k: bf16[256,128,1], q: bf16[2,64,128,1], w: bf16[2,64,128,1]) -> f32[4] {
  %c = bf16[2,64,256]{2,1,0} parameter(2)
  %k = bf16[256,128,1]{2,1,0} parameter(3)
  %q = bf16[2,64,128,1]{3,2,1,0} parameter(4)
  %w = bf16[2,64,128,1]{3,2,1,0} parameter(5)
  %loop = (s32[], f32[4]) while(%init), condition=%cond, body=%body
  %g = (bf16[2,8], bf16[4,8]) all-gather-start(%b), dimensions={0}
  %d = bf16[4,8]{1,0} all-gather-done(%g)
  %dense = bf16[2,64,128]{2,1,0} convolution(%c, %k), window={size=1}, dim_labels=0bf_io0->0bf
  %heads = bf16[2,64,2,64]{3,1,2,0} convolution(%q, %w), window={size=1x2 pad=0_0x1_1 rhs_reversal=0x1}, dim_labels=0bf1_1oi0->0b1f
  ROOT %o = f32[4] get-tuple-element(%loop), index=1
}
"""


def test_hlo_counts_loop_bodies_once_per_iteration():
    program = hlo.analyse(HLO)
    found = program.collectives
    assert found.count["all-reduce"] == 3 and found.bytes["all-reduce"] == 3 * 16
    assert found.count["all-gather"] == 1 and found.bytes["all-gather"] == 4 * 8 * 2
    assert found.total_bytes == 48 + 64 and found.uncounted_loops == 0
    # The dot in a fusion the loop body calls: 2 x (4 x 8) x 16, three times. A dense layer
    # as TPU writes it (batch as a window): 2 x (2 x 64 x 128) x 256. Heads as a padded window
    # (the kernel's heads picked one an output): 2 x (2 x 64 x 2 x 64) x 128.
    assert program.matmul_flops == 3 * 2 * 32 * 16 + 2 * 16384 * 256 + 2 * 16384 * 128


# GPU targets: names and the target description, without the CUDA plugin (gpu-compile extra).
def test_gpu_node_names_and_their_target_config():
    slice_ = topology.parse("H100-8")
    assert (slice_.name, slice_.chips, slice_.chip.platform) == ("h100-8", 8, "cuda")
    assert "h200-4" in topology.known_names()
    with pytest.raises(UserError, match="unknown topology 'h100-16'"):
        topology.parse("h100-16")
    text = gpu.target_config("h200")
    assert 'name: "NVIDIA H200 141GB HBM3e"' in text and "core_count: 132" in text
    assert "device_memory_size: 151397597184" in text
    assert text.count("rate_infos") == 6 + 16 and "collective_memory_granularity" not in text
