"""benchmarks/transformers_budget.py: transformers' BertForMaskedLM pretrained for a wall-clock
budget on a bertjax prepared corpus; its checkpoints convert with `bertjax.convert --from-hf` and
load with bertjax.load, holding the weights transformers saved."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
from safetensors.numpy import load_file

import bertjax
from pretrain_runs import REPO, child_env, run_cli

sys.path.insert(0, os.path.join(REPO, "benchmarks"))
import transformers_budget  # noqa: E402

pytestmark = pytest.mark.benchmark


def test_the_rate_is_laid_over_the_budget():
    rate = transformers_budget.learning_rate
    assert [rate(1e-3, p, 0.1) for p in (0.0, 0.05, 0.1, 0.55, 1.0, 1.2)] == pytest.approx(
        [0.0, 5e-4, 1e-3, 5e-4, 0.0, 0.0])
    assert rate(1e-3, 0.5, 0.0) == pytest.approx(5e-4)  # no warmup


def test_a_budget_run_saves_checkpoints_bertjax_loads(tmp_path, small_corpus_dir):
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "benchmarks/transformers_budget.py", "--prepared", small_corpus_dir,
         "--minutes", "0.1", "--preset", "tiny", "--batch-size", "8", "--seq-len", "64",
         "--learning-rate", "1e-3", "--warmup-fraction", "0.1", "--save-at", "0.5,1",
         "--eval-batches", "2", "--threads", "1", "--data-workers", "0",
         "--output-dir", str(out)],
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((out / transformers_budget.SUMMARY_FILE).read_text())
    assert summary == json.loads(done.stdout)
    assert summary["steps"] >= 1 and summary["tokens"] == summary["steps"] * 8 * 64
    assert summary["tokens_per_s"] > 0 and summary["threads"] == 1
    assert [p["fraction"] for p in summary["points"]] == [0.5, 1.0]
    assert all(0 <= p["eval_mlm_accuracy"] <= 1 for p in summary["points"])
    saved = summary["points"][-1]["path"]
    assert sorted(os.listdir(saved)) == ["config.json", "model.safetensors",
                                         "special_tokens_map.json", "tokenizer_config.json",
                                         "vocab.txt"]

    converted = str(tmp_path / "converted")
    done = run_cli("bertjax.convert", "--from-hf", saved, "--output", converted)
    assert done.returncode == 0, done.stderr[-3000:]
    model = bertjax.load(converted)
    assert (model.config.hidden_size, model.config.num_layers, model.config.vocab_size) == (
        128, 2, 1000)
    weights = load_file(os.path.join(saved, "model.safetensors"))
    np.testing.assert_array_equal(
        model.loaded.params["encoder"]["embeddings"]["word_embeddings"],
        weights["bert.embeddings.word_embeddings.weight"])
    np.testing.assert_array_equal(model.loaded.params["mlm"]["bias"],
                                  weights["cls.predictions.bias"])
    assert model.embed(["the history of the city"]).shape == (1, 128)
