"""The benchmark CLI: every figure printed and written, the FLOP formula against XLA's own count,
the peak table, and bad flags refused with one line and exit status 2."""

import json
import math
import os
import subprocess
import sys

import jax
import jax.numpy as jnp
import pytest

from bertjax.bench import flops

from bertjax.cli import bench as cli
from bertjax.bench.jax_step import Workload, synthetic_batch
from bertjax.model.config import preset
from bertjax.model.flops import train_step_flops
from bertjax.model.heads import BertForPretraining
from bertjax.train.objectives import pretraining_loss
from pretrain_runs import CHILD_XLA_FLAGS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TINY = f"--config={REPO}/configs/tiny.py"


@pytest.mark.slow
def test_cli_prints_and_writes_every_field(tmp_path):
    out = tmp_path / "bench.json"
    env = dict(os.environ)
    # One CPU device and the least backend optimization: compiling dominates a run this small.
    env["XLA_FLAGS"] = CHILD_XLA_FLAGS
    args = [sys.executable, "-m", "bertjax.bench", TINY, "--config.model.num_layers=1",
            "--seq-len", "16", "--batch", "2", "--steps", "2", "--warmup", "1",
            "--compare-torch", "--peak-tflops", "0.5", "--json", str(out)]
    proc = subprocess.run(args, env=env, cwd=REPO, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    labels = [line.split(":", 1)[0] for line in proc.stdout.splitlines()]
    assert labels == ["model", "workload", "compile", "step", "tokens/s", "flops", "TFLOP/s",
                      "MFU", "memory", "torch", "ratio"]
    r = json.loads(out.read_text())
    assert (r["batch"], r["seq_len"], r["predictions"], r["devices"]) == (2, 16, 3, 1)
    assert r["steps"] == 2 and r["platform"] == "cpu"
    assert r["compile_s"] > 0 and r["step_s_min"] <= r["step_s"] <= r["step_s_max"]
    assert r["tokens_per_s"] == pytest.approx(2 * 16 / r["step_s"])
    assert r["cores_busy"] > 0 and r["load_average_1m"] >= 0
    cfg = preset("tiny", num_layers=1, vocab_size=8192)
    assert r["model_tflop_per_step"] == pytest.approx(
        train_step_flops(cfg, 2, 16, 3).total / 1e12)
    assert sum(r["model_tflop_parts"].values()) == pytest.approx(r["model_tflop_per_step"])
    assert r["xla_tflop_per_device_step"] > 0
    assert r["model_tflops_per_s"] == pytest.approx(r["model_tflop_per_step"] / r["step_s"])
    assert r["peak_source"] == "--peak-tflops"
    assert r["mfu"] == pytest.approx(r["model_tflops_per_s"] / 0.5)
    assert r["peak_memory_bytes"] > 0 and "memory_analysis" in r["peak_memory_source"]
    assert r["process_peak_rss_bytes"] > r["peak_memory_bytes"]
    # The peer is the same model: the same parameter count; both losses start near ln V + ln 2
    # (untrained) and fall over the few steps on the one batch.
    t = r["torch"]
    assert t["params"] == r["params"]
    for loss in (r["loss"], t["loss"]):
        assert 0 < loss < math.log(8192) + math.log(2)
    assert t["tokens_per_s"] == pytest.approx(2 * 16 / t["step_s"])
    assert r["speedup_vs_torch"] == pytest.approx(r["tokens_per_s"] / t["tokens_per_s"])
    assert t["threads"] >= 1 and t["transformers"] and t["attention"]


def test_mfu_is_na_without_a_known_peak():
    r = {"preset": "tiny", "params": 1, "objective": "bert", "dtype": "float32",
         "scan_layers": True, "remat": "none", "devices": 1, "device_kind": "cpu",
         "platform": "cpu", "jax": jax.__version__, "batch": 1, "seq_len": 8, "predictions": 1,
         "warmup": 0, "steps": 1, "compile_s": 1.0, "step_s": 1.0, "step_s_min": 1.0,
         "step_s_max": 1.0, "cores_busy": 1.0, "load_average_1m": 0.0, "tokens_per_s": 8.0,
         "model_tflop_per_step": 1e-6,
         "xla_tflop_per_device_step": None, "model_tflops_per_s": 1e-6, "mfu": None,
         "peak_memory_bytes": 1, "peak_memory_source": "x", "process_peak_rss_bytes": 1}
    assert "MFU:      n/a (no peak known for 'cpu'; pass --peak-tflops)" in cli.describe(r)


@pytest.mark.parametrize("kind, peak", [
    ("TPU v4", 275), ("TPU v5 lite", 197), ("TPU v5", 459), ("TPU v5p", 459),
    ("NVIDIA H100 80GB HBM3", 989), ("NVIDIA H200", 989), ("NVIDIA A100-SXM4-80GB", 312),
    ("cpu", None)])
def test_peak_table(kind, peak):
    assert flops.peak_tflops(kind) == peak


# (layers, hidden, heads, ffn, vocab, seq_len, batch, predictions): one shape where the MLM head
# is half the work (counting it at every position would overshoot XLA 3x), one where attention
# is 40% (leaving it out would undershoot by as much).
SHAPES = {"mlm_heavy": (1, 64, 2, 256, 4096, 16, 4, 3),
          "attention_heavy": (1, 32, 2, 128, 64, 128, 2, 8)}


@pytest.mark.parametrize("shape", SHAPES.values(), ids=SHAPES.keys())
def test_flop_formula_agrees_with_xla_cost_analysis(shape):
    """XLA counts the same matmuls plus elementwise work (GELU, softmax, LayerNorm, losses), so
    its count must lie between 1.0x and 1.3x the formula's."""
    layers, hidden, heads, ffn, vocab, seq_len, batch, predictions = shape
    config = preset("tiny", num_layers=layers, hidden_size=hidden, num_heads=heads,
                    intermediate_size=ffn, vocab_size=vocab, hidden_dropout=0.0,
                    attention_dropout=0.0, max_position_embeddings=seq_len)
    model = BertForPretraining(config)
    data = synthetic_batch(Workload(batch, seq_len, predictions), vocab, nsp=True, span=False)
    data = {k: jnp.asarray(v) for k, v in data.items()}
    # Shapes are all XLA's count needs (and tracing an init beats running one op by op).
    params = jax.eval_shape(lambda: model.init(jax.random.PRNGKey(0), data))["params"]

    def loss(params, data):
        return pretraining_loss(model.apply({"params": params}, data), data)[0]

    # Forward + backward on one device, no optimizer: exactly what the formula counts, plus the
    # elementwise work. (A while loop's body would be counted once, so the layers are unrolled.)
    compiled = jax.jit(jax.grad(loss)).lower(params, data).compile(
        compiler_options={"xla_backend_optimization_level": 0})
    formula = train_step_flops(config, batch, seq_len, predictions).total
    assert 1.0 <= flops.xla_flops(compiled) / formula <= 1.3


def test_synthetic_batch_follows_the_schema():
    b = synthetic_batch(Workload(4, 32, 5), 100, nsp=True, span=True)
    assert (b["input_ids"][:, 0] == 2).all() and (b["input_ids"][:, -1] == 3).all()
    assert ((b["input_ids"] == 3).sum(axis=1) == 2).all()  # two [SEP]
    assert (b["input_ids"][b["input_ids"] > 4] < 100).all()
    positions = b["masked_positions"]
    assert (jnp.diff(positions, axis=1) > 0).all() and (positions > 0).all()
    assert (b["input_ids"][jnp.arange(4)[:, None], positions] == 4).all()  # [MASK]
    assert (b["masked_ids"] > 4).all() and b["masked_weights"].sum() == 20
    assert set(b) >= {"nsp_label", "span_left", "span_right", "span_offset"}


BAD_FLAGS = {
    "unknown flag": [TINY, "--nope"],
    "zero batch": [TINY, "--batch", "0"],
    "non-numeric steps": [TINY, "--steps", "many"],
    "negative peak": [TINY, "--peak-tflops", "-3"],
    "stray argument": [TINY, "extra"],
    "no config": ["--batch", "8"],
    "missing config file": ["--config=configs/nope.py"],
    "unknown config key": [TINY, "--config.model.nope=1"],
    "too long": [TINY, "--seq-len", "1024"],
    "too many predictions": [TINY, "--seq-len", "16", "--predictions", "14"],
    "batch not divisible over 8 devices": [TINY, "--batch", "4"],
    "torch peer of roberta": [TINY, "--config.objective=roberta", "--compare-torch"],
    "json into a missing directory": [TINY, "--json", "/nonexistent/dir/out.json"],
}


@pytest.mark.parametrize("args", BAD_FLAGS.values(), ids=BAD_FLAGS.keys())
def test_bad_flags_exit_2_with_one_line(args, capsys, monkeypatch):
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # the config parser rewrites sys.argv
    monkeypatch.chdir(REPO)
    assert cli.main(["bertjax.bench", *args]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("bertjax: error: "), captured.err
    assert captured.out == ""
