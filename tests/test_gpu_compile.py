"""`python -m bertjax.compile --topology=h100-8`: the real train step compiled for one node of
eight H100s by the CUDA plugin (the gpu-compile extra) with no GPU on the machine, its report's
matmul FLOPs equal to the analytic count (the GPU's loops counted by their known trip counts).

`make test-all` installs the extra into .venv/gpu-compile, apart from the venv (installed there,
the plugin prints its failed CUDA checks in every JAX process of a machine without a GPU); the
compile runs with that folder on its PYTHONPATH."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
PLUGIN = Path(sys.prefix) / "gpu-compile"

pytestmark = pytest.mark.gpu_compile

# The smallest step (tests/test_compile.py's): configs/tiny.py, one phase of 32 tokens, 8 rows.
SMALL = ["--config=configs/tiny.py", "--config.schedule.long_fraction=0",
         "--config.schedule.short_seq_len=32", "--config.schedule.short_max_predictions=5",
         "--config.train.batch_size=8", "--config.model.dtype=bfloat16"]


def test_a_step_compiles_for_an_h100_node(tmp_path):
    out = tmp_path / "h100.json"
    assert (PLUGIN / "jax_plugins" / "xla_cuda12").is_dir(), "make install-all puts it there"
    env = {**os.environ, "PYTHONPATH": str(PLUGIN)}
    result = subprocess.run([sys.executable, "-m", "bertjax.compile", *SMALL, "--topology=h100-8",
                             f"--json={out}"], cwd=REPO, env=env, capture_output=True, text=True,
                            timeout=600)
    assert result.returncode == 0, result.stderr
    report = json.loads(out.read_text())
    assert report["chips"] == 8 and report["device_kind"] == "NVIDIA H100 80GB HBM3"
    phase, = report["phases"]
    assert phase["uncounted_loops"] == 0
    assert phase["flops"] == pytest.approx(phase["model_flops_step_all_chips"] / 8, rel=0.05)
    assert 0 < phase["memory_bytes"]["total"] < phase["hbm_bytes"]
