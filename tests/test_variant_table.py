"""benchmarks/variant_table.py end to end at a minimal budget: two variants pretrained, a
random-init Hugging Face BERT imported, random init, each fine-tuned on one task; the table's rows
and columns, and its scores those of the fine-tuning runs' own results.json; a rerun runs nothing.
Bad flags are refused in one line before anything is written."""

import collections
import json
import os
import subprocess
import sys

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "benchmarks"))

import random_hf_model  # noqa: E402

SCRIPT = os.path.join(REPO, "benchmarks", "variant_table.py")
MINIMAL = ["--variants", "bert,roberta", "--steps", "8", "--batch-size", "8", "--seq-len", "64",
           "--eval-batches", "2", "--tasks", "sentiment", "--max-train-examples", "32",
           "--max-eval-examples", "32", "--epochs", "1", "--jobs", "2"]
METRICS = {"sentiment": "accuracy"}


def _run(*flags):
    return subprocess.run([sys.executable, SCRIPT, *flags], cwd=REPO, capture_output=True,
                          text=True, env={**os.environ, "PYTHONPATH": REPO})


def _table_rows(stdout: str) -> list[list[str]]:
    return [[cell.strip() for cell in line.strip("|").split("|")]
            for line in stdout.splitlines() if line.startswith("|")]


def _scores_in_result_files(workdir: str) -> dict:
    """{task: sorted last-epoch test scores} read from every fine-tuning run's results.json."""
    found = collections.defaultdict(list)
    for name in os.listdir(workdir):
        task = name.split("-")[0]
        results = os.path.join(workdir, name, "results.json")
        if task in METRICS and os.path.isfile(results):
            with open(results) as f:
                found[task].append(json.load(f)["history"][-1][METRICS[task]])
    return {task: sorted(scores) for task, scores in found.items()}


@pytest.mark.slow
def test_the_table_holds_every_start_and_task_scored_by_its_runs(tmp_path):
    hf = random_hf_model.save(str(tmp_path / "hf"))
    workdir = str(tmp_path / "bench")
    done = _run(*MINIMAL, "--hf", f"random-tiny={hf}", "--workdir", workdir)
    assert done.returncode == 0, done.stderr[-3000:]
    rows = _table_rows(done.stdout)
    assert rows[0] == ["starting point", "pretraining", "held-out MLM", "sentiment (accuracy)"]
    labels = [row[0] for row in rows[2:]]
    assert labels == ["bert (configs/base.py)", "roberta (configs/roberta.py)", "random init",
                      "random-tiny (Hugging Face import)"]
    assert "8 steps of 8 x 64 tokens" in done.stdout and "refused" not in done.stdout

    with open(os.path.join(workdir, "variant_table.json")) as f:
        results = json.load(f)["results"]
    assert sorted(results) == sorted(labels)
    from_files = _scores_in_result_files(workdir)
    for column, task in enumerate(METRICS, start=3):
        scores = [results[label][task] for label in labels]
        assert all(len(s) == 1 and isinstance(s[0], float) and 0 <= s[0] <= 1 for s in scores)
        assert sorted(s[0] for s in scores) == from_files[task]
        assert [row[column] for row in rows[2:]] == [f"{100 * s[0]:.1f}" for s in scores]

    again = _run(*MINIMAL, "--hf", f"random-tiny={hf}", "--workdir", workdir)
    assert again.returncode == 0 and _table_rows(again.stdout) == rows
    assert "bertjax.main" not in again.stderr  # every run's result file was read, none rerun


@pytest.mark.slow
@pytest.mark.parametrize("flags, message", [
    (["--variants", "bert,gpt"], "unknown variant 'gpt'"),
    (["--tasks", "sentiment,squad"], "unknown task 'squad'"),
    (["--hf", "roberta-base"], "--hf takes NAME=DIR"),
    (["--hf", "x=/nonexistent/roberta-base"], "holds no config.json"),
    (["--steps", "0"], "must be positive"),
])
def test_bad_flags_are_refused_before_the_workdir_is_made(tmp_path, flags, message):
    workdir = tmp_path / "bench"
    done = _run(*flags, "--workdir", str(workdir))
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.startswith("bertjax: error: ") and message in done.stderr
    assert len(done.stderr.strip().splitlines()) == 1
    assert not workdir.exists()
