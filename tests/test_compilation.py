"""The compiled step's memory, checked before the first step: a config that does not fit the
device (here, the configured train.device_memory_gb: CPUs report no limit) is refused with exit 2
and one clear line, before any step runs or any checkpoint is written."""

import os
import re
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from bertjax.core.errors import UserError
from bertjax.train import compilation
from pretrain_runs import CHILD_XLA_FLAGS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _matmul():
    # 1 MiB argument ([512, 512] fp32), a scalar out.
    return jax.jit(lambda x: (x @ x).sum()), jax.ShapeDtypeStruct((512, 512), jnp.float32)


def test_memory_limit_comes_from_the_config_or_the_device():
    assert compilation.device_memory_limit() is None  # the CPU backend reports none
    assert compilation.memory_limit(0.0) == (None, "reported by the device")
    assert compilation.memory_limit(2.5) == (int(2.5 * 2**30), "train.device_memory_gb")
    with pytest.raises(UserError, match="must not be negative"):
        compilation.memory_limit(-1.0)


def test_compile_step_reports_memory_and_refuses_a_step_that_does_not_fit(capsys):
    fn, x = _matmul()
    compiled = compilation.compile_step(fn, x, name="matmul", device_memory_gb=1.0)
    assert float(compiled(jnp.ones((512, 512)))) == 512.0**3
    line = capsys.readouterr().err.strip()
    assert re.fullmatch(r"compiled matmul in [\d.]+s; memory per device: argument 1\.0 MiB, "
                        r"output 0\.0 MiB, alias 0\.0 MiB, temp [\d.]+ MiB, peak [\d.]+ MiB; "
                        r"device holds 1\.00 GiB \(train\.device_memory_gb\)", line), line
    assert compilation.memory_report(compiled)["argument"] == 2**20
    with pytest.raises(UserError, match=r"matmul needs 1\.\d MiB per device but a device holds "
                                        r"0\.5 MiB \(train\.device_memory_gb\): lower "
                                        r"train\.batch_size"):
        compilation.compile_step(fn, x, name="matmul", device_memory_gb=0.5 / 1024)
    compilation.compile_step(fn, x, name="matmul")  # no limit known: nothing to refuse
    assert "device memory unknown" in capsys.readouterr().err


@pytest.mark.slow
def test_a_run_that_does_not_fit_is_refused_before_its_first_step(tmp_path, small_corpus_dir):
    workdir = tmp_path / "wd"
    settings = {"data.prepared": small_corpus_dir, "data.workers": 0, "train.steps": 4,
                "train.batch_size": 8, "schedule.short_seq_len": 32,
                "schedule.short_max_predictions": 5, "schedule.long_fraction": 0,
                "optimizer.warmup_steps": 1, "train.device_memory_gb": 0.001,
                "train.fit": "off"}  # auto would first try remat and accumulation
    # JAX_PLATFORMS stays: with libtpu installed (the test extra) JAX would otherwise try a TPU.
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("JAX_") or k == "JAX_PLATFORMS"}
    # One CPU device; the least compile work.
    env["XLA_FLAGS"] = CHILD_XLA_FLAGS
    result = subprocess.run(
        [sys.executable, "-m", "bertjax.main", f"--config={REPO}/configs/tiny.py",
         f"--workdir={workdir}", *(f"--config.{k}={v}" for k, v in settings.items())],
        env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 2, result.stderr[-2000:]
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, lines  # the refusal alone: it names the figures
    assert re.fullmatch(r"bertjax: error: train step at 32 tokens needs [\d.]+ MiB per device "
                        r"but a device holds 1\.0 MiB \(train\.device_memory_gb\): lower "
                        r"train\.batch_size, raise train\.accumulation_steps, set model\.remat, "
                        r"or shard over more devices \(mesh\.fsdp\)", lines[-1]), lines[-1]
    assert not (workdir / "checkpoints").exists() and not (workdir / "metrics.jsonl").exists()


@pytest.mark.parametrize("message, sizes", [
    ("RESOURCE_EXHAUSTED: XLA:TPU compile permanent error. Ran out of memory in memory space "
     "hbm. Used 2.60T of 15.75G hbm. Exceeded hbm capacity by 2.58T. the total memory required "
     "for HLO temporaries (2.60T) exceeds available HBM (15.75G)", (2.60 * 1024, 15.75)),
    ("Ran out of memory in memory space hbm. ... (309.71G) exceeds available HBM (15.75G)",
     (309.71, 15.75)),
    ("... required for arguments (512.00M) exceeds available HBM (16.00G)", (0.5, 16.0)),
    ("RESOURCE_EXHAUSTED: Ran out of memory in memory space hbm. Used 1.50T of 95.74G hbm.",
     (1.5 * 1024, 95.74)),
])
def test_libtpus_out_of_memory_refusal_is_read_whatever_its_unit(message, sizes):
    assert compilation.out_of_hbm(message) == pytest.approx(sizes)


def test_other_compile_errors_are_not_read_as_out_of_memory():
    assert compilation.out_of_hbm("INTERNAL: Mosaic failed to compile TPU kernel") is None
