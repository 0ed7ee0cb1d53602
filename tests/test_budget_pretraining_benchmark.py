"""benchmarks/budget_pretraining.py end to end on a tiny budget: configs/budget.py pretrained for
the budget with a checkpoint half-way, transformers' peer for the same wall time, imported with
convert, each fine-tuned from alike (and from random init) on two task kinds, the baselines, the
table, the goals and the PNG; and its baselines checked on data whose answer is known."""

import os
import subprocess
import sys

import numpy as np
import pytest
import scipy.sparse

from pretrain_runs import REPO, child_env

sys.path.insert(0, os.path.join(REPO, "benchmarks"))
import budget_baselines  # noqa: E402

pytestmark = pytest.mark.benchmark


def run_script(path: str, *args, **kwargs) -> subprocess.CompletedProcess:
    """`python PATH ARGS...`, as a user runs a benchmark."""
    return subprocess.run([sys.executable, path, *args], **kwargs)


def test_the_benchmark_runs_end_to_end(tmp_path, small_corpus_dir):
    workdir = tmp_path / "bench"
    done = run_script(
        "benchmarks/budget_pretraining.py", "--minutes", "0.05", "--points",
        "0.5,1", "--peer-points", "1", "--seeds", "1", "--tasks", "sentiment,pos",
        "--size", "tiny", "--batch-size", "8", "--max-train-examples", "48",
        "--max-eval-examples", "64", "--epochs", "1", "--jobs", "2", "--data-workers", "0",
        "--prepared",
        small_corpus_dir,
        "--workdir", str(workdir),
        cwd=REPO, env=child_env(BERTJAX_CACHE=os.environ["BERTJAX_CACHE"]),
        capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-4000:]
    table = [line for line in done.stdout.splitlines() if line.startswith("| ")]
    starts = [line.split(" | ")[0][2:] for line in table[1:]]
    # The peer saved at the end only (its checkpoints along the way: test_transformers_budget).
    assert starts == ["random init", "bertjax 0.025 min", "bertjax 0.05 min", "transformers 0.05 min",
                      "TF-IDF + logistic regression", "most frequent tag per word"]
    for line in table[1:5]:  # every starting point fine-tuned on both tasks
        cells = line.strip("| ").split(" | ")
        assert all(0 <= float(c.split()[0]) <= 100 for c in cells[3:5]), line
    assert "bertjax 0.05 min beats random init by" in done.stdout
    assert "at equal wall time bertjax" in done.stdout and "in half the time" in done.stdout
    assert (workdir / "budget_pretraining.png").stat().st_size > 10_000
    # A rerun finds every result on disk: nothing is trained again.
    again = run_script(
        "benchmarks/budget_pretraining.py", "--minutes", "0.05", "--points",
        "0.5,1", "--peer-points", "1", "--seeds", "1", "--tasks", "sentiment,pos",
        "--size", "tiny", "--batch-size", "8", "--max-train-examples", "48",
        "--max-eval-examples", "64", "--epochs", "1", "--data-workers", "0", "--prepared",
        small_corpus_dir, "--workdir", str(workdir),
        cwd=REPO, env=child_env(BERTJAX_CACHE=os.environ["BERTJAX_CACHE"]),
        capture_output=True, text=True, timeout=300)
    assert again.returncode == 0 and "$ -m bertjax.main" not in again.stderr
    assert [line for line in again.stdout.splitlines() if line.startswith("| ")] == table


def test_bad_arguments_are_refused_in_one_line(tmp_path):
    for bad in (["--points", "0.3,1"], ["--points", "0.5"], ["--tasks", "poetry"],
                ["--minutes", "0"], ["--peer-points", "half"], ["--data-workers", "-2"]):
        done = run_script(
            "benchmarks/budget_pretraining.py", *bad, "--workdir", str(tmp_path / "w"),
            cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=120)
        assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, bad


def test_logistic_regression_separates_what_is_separable():
    rng = np.random.default_rng(0)
    x = rng.normal(size=(200, 5))
    y = (x[:, 0] + 0.5 * x[:, 1] > 0).astype(int)
    w = budget_baselines.logistic_regression(scipy.sparse.csr_matrix(x), y, 2, c=100.0)
    predicted = (np.hstack([x, np.ones((200, 1))]) @ w).argmax(axis=1)
    assert (predicted == y).mean() > 0.97


def test_tfidf_matches_the_smoothed_idf_weighting():
    rows = budget_baselines.fit_tfidf(["a cat sat", "the cat ran", "the dog"])
    got = rows(["the cat cat"]).toarray()[0]
    idf_cat, idf_the = np.log(4 / 3) + 1, np.log(4 / 3) + 1
    expected = np.array([2 * idf_cat, idf_the]) / np.linalg.norm([2 * idf_cat, idf_the])
    vocabulary = ["cat", "dog", "ran", "sat", "the"]
    np.testing.assert_allclose(got[[vocabulary.index("cat"), vocabulary.index("the")]], expected)
    np.testing.assert_allclose(got.sum(), expected.sum())  # nothing else in the row


def test_entities_and_the_word_tag_rule():
    assert budget_baselines._entities(["B-PER", "I-PER", "O", "I-LOC", "B-ORG"]) == {
        (0, 2, "PER"), (3, 4, "LOC"), (4, 5, "ORG")}


def test_the_recipe_variants_run_end_to_end(tmp_path, small_corpus_dir):
    done = run_script(
        "benchmarks/budget_recipe.py", "--minutes", "0.05", "--variants",
        "tiny", "--prepared", small_corpus_dir, "--max-train-examples", "48",
        "--max-eval-examples", "64", "--epochs", "1", "--data-workers", "0",
        "--workdir", str(tmp_path / "recipe"),
        cwd=REPO, env=child_env(BERTJAX_CACHE=os.environ["BERTJAX_CACHE"]),
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    row = [line for line in done.stdout.splitlines() if line.startswith("| tiny |")]
    steps, mlm, sentiment = row[-1].strip("| ").split(" | ")[1:]
    assert int(steps) >= 1 and 0 <= float(mlm.rstrip("%")) <= 100
    assert 0 <= float(sentiment.rstrip("%")) <= 100
