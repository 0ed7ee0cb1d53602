"""benchmarks/bert_reference.py: BERT pretraining (MLM + NSP) in bertjax and in transformers from
the same weights on the same batches. Its masked-slot shortcut is transformers' own loss, and a
short run end to end gives curves that coincide to fp32 rounding and draws them."""

import json
import os
import subprocess
import sys

import numpy as np
import pytest
import torch
from transformers import BertConfig, BertForPreTraining

from bertjax.bench.torch_peer import _hf_inputs
from pretrain_runs import REPO, child_env

sys.path.insert(0, os.path.join(REPO, "benchmarks"))
import bert_reference  # noqa: E402


def batch(rng, rows=4, length=16, predictions=4, vocab=50):
    mask = np.ones((rows, length), np.int32)
    mask[1, 11:] = 0
    positions = np.stack([np.sort(rng.choice(np.arange(1, 10), predictions, replace=False))
                          for _ in range(rows)]).astype(np.int32)
    weights = np.ones((rows, predictions), np.float32)
    weights[2, -1] = 0.0  # an unused slot
    segments = np.zeros((rows, length), np.int32)
    segments[:, 6:] = 1
    return {"input_ids": rng.integers(5, vocab, (rows, length)).astype(np.int32) * mask,
            "input_mask": mask, "segment_ids": segments * mask, "masked_positions": positions,
            "masked_ids": rng.integers(5, vocab, (rows, predictions)).astype(np.int32),
            "masked_weights": weights, "nsp_label": np.array([0, 1, 1, 0], np.int32)}


def test_the_masked_slot_loss_is_transformers_own():
    """torch_forward runs the MLM head at the masked slots only; its loss is the one
    BertForPreTraining computes itself from -100 labels over every position."""
    torch.manual_seed(0)
    model = BertForPreTraining(BertConfig(
        vocab_size=50, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
        intermediate_size=48, max_position_embeddings=32, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0, attn_implementation="eager")).train()
    b = batch(np.random.default_rng(0))
    ours, sums = bert_reference.torch_forward(model, b)
    theirs = model(**_hf_inputs(torch, b)).loss
    assert abs(ours.item() - theirs.item()) < 1e-6
    assert sums["mlm_weight"] == 15 and sums["nsp_count"] == 4
    figures = bert_reference.figures(sums)
    assert abs(figures["loss"] - ours.item()) < 1e-5


@pytest.mark.slow
def test_twenty_steps_coincide_with_transformers(tmp_path, small_corpus_dir):
    out = tmp_path / "out"
    done = subprocess.run(
        [sys.executable, "benchmarks/bert_reference.py", "--steps", "20", "--every", "10",
         "--batch-size", "8", "--seq-len", "64", "--corpus", small_corpus_dir,
         "--output-dir", str(out)],
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert (out / bert_reference.PLOT_FILE).stat().st_size > 10_000
    record = json.loads((out / bert_reference.STEPS_FILE).read_text())
    ours, theirs = record["steps"]["bertjax"], record["steps"]["transformers"]
    assert len(ours["loss"]) == len(theirs["loss"]) == 20
    # Measured: at most ~1e-5 over these steps (fp32 rounding); the losses fall meanwhile.
    assert record["summary"]["max_abs_loss_diff"] < 1e-4
    np.testing.assert_allclose(ours["mlm_loss"], theirs["mlm_loss"], atol=1e-4)
    np.testing.assert_allclose(ours["nsp_loss"], theirs["nsp_loss"], atol=1e-4)
    assert np.abs(np.subtract(ours["mlm_accuracy"], theirs["mlm_accuracy"])).max() <= 0.02
    assert np.mean(ours["loss"][-5:]) < np.mean(ours["loss"][:5]) - 0.3
    assert "| 11-20 |" in done.stdout and "max |loss difference|" in done.stdout
