"""`python -m bertjax.bench --task finetune`: an epoch on real data, ours with and without length
buckets and transformers', printed and written; a config it cannot time refused in one line."""

import json
import os
import subprocess
import sys

import pytest

from pretrain_runs import CHILD_XLA_FLAGS

pytestmark = pytest.mark.benchmark

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def bench(*args):
    env = dict(os.environ, XLA_FLAGS=CHILD_XLA_FLAGS)
    return subprocess.run([sys.executable, "-m", "bertjax.bench", "--task", "finetune",
                                 *args], env=env, cwd=REPO, capture_output=True, text=True, timeout=600)


def test_an_epoch_is_timed_bucketed_padded_and_against_transformers(tmp_path, minilm_dir):
    out = tmp_path / "epoch.json"
    proc = bench(f"--config={REPO}/configs/finetune_sentiment.py",
                 "--config.model.preset=tiny", f"--config.data.tokenizer={minilm_dir}",
                 "--config.data.max_seq_len=128", "--config.train.batch_size=16",
                 "--examples", "32", "--compare-torch", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    r = json.loads(out.read_text())
    assert r["rows"] == 32 and r["batch"] == 16 and r["max_seq_len"] == 128
    assert r["dtype"] == r["matmul_dtype"] == "float32"
    bucketed, padded, torch = r["epochs"]
    assert bucketed["label"].startswith("bertjax, buckets 32/64/96/128")
    assert padded["label"] == "bertjax, padded to 128" and torch["label"].startswith("transformers")
    for epoch in r["epochs"]:
        assert epoch["steps"] == 2 and epoch["seconds"] > 0 and 0 < epoch["loss"] < 2
        assert epoch["examples_per_s"] == pytest.approx(32 / epoch["seconds"])
    # The same real tokens on every side; the padding differs as each pads.
    assert bucketed["real_tokens"] == padded["real_tokens"] == torch["real_tokens"]
    assert padded["tokens"] == 32 * 128
    assert bucketed["tokens"] < padded["tokens"] / 2 and 1 <= bucketed["compiles"] <= 4
    assert torch["tokens"] < padded["tokens"]  # padded to each batch's longest row
    assert r["speedup_vs_torch"] == pytest.approx(torch["seconds"] / bucketed["seconds"])
    lines = proc.stdout.splitlines()
    assert sum(line.startswith("| bertjax") for line in lines) == 2
    assert lines[-1].startswith("ratio:")


def test_packing_adds_a_packed_epoch_of_the_same_real_tokens(tmp_path, minilm_dir):
    out = tmp_path / "epoch.json"
    proc = bench(f"--config={REPO}/configs/finetune_sentiment.py",
                 "--config.model.preset=tiny", f"--config.data.tokenizer={minilm_dir}",
                 "--config.train.batch_size=8", "--config.train.packing=true",
                 "--examples", "48", "--json", str(out))
    assert proc.returncode == 0, proc.stderr
    r = json.loads(out.read_text())
    bucketed, padded, packed = r["epochs"]
    assert packed["label"].startswith("bertjax, packed (up to ")
    assert packed["real_tokens"] == bucketed["real_tokens"] == padded["real_tokens"]
    assert packed["steps"] < padded["steps"] == 6 and packed["compiles"] == 1
    assert packed["padded_tokens_per_real"] < bucketed["padded_tokens_per_real"]
    assert r["packed_speedup"][padded["label"]] == pytest.approx(
        padded["seconds"] / packed["seconds"])
    assert proc.stdout.splitlines()[-1].startswith("packed:   an epoch ")


@pytest.mark.parametrize("args, message", [
    ([f"--config={REPO}/configs/tiny.py"], "--task finetune times finetune_classification"),
    ([f"--config={REPO}/configs/finetune_qa.py"], "the config's task is 'finetune_qa'"),
    ([f"--config={REPO}/configs/finetune_ner.py", "--config.train.packing=true"],
     "train.packing works with task=finetune_classification"),
])
def test_a_config_it_cannot_time_is_one_line_and_exit_2(args, message):
    proc = bench(*args)
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], proc.stderr
