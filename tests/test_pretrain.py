"""The pretraining job end to end: `python -m bertjax.main` on real text, exact resume after SIGKILL
across the length switch, SIGTERM, and bad configs refused without touching the workdir."""

import hashlib
import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from bertjax.inference import loading
from bertjax.cli import main
from bertjax.interop import params_dir
from bertjax.train.metrics_log import read_metrics
from bertjax.train.step_timing import TIMING_FIELDS
from pretrain_runs import CHILD, SHORT, child_env, run_child, tiny_args
import run_devices
from trees import flat

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def logged(workdir):
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in read_metrics(workdir)]


@pytest.fixture(scope="module")
def finished_run(tmp_path_factory, small_corpus_dir):
    workdir = str(tmp_path_factory.mktemp("run") / "wd")
    # Unoptimized, as the tests' short runs are: its 12 steps do not pay back -O1's compile.
    code = main.main(tiny_args(workdir, small_corpus_dir, **{"data.workers": 1,
                                                             "train.plot": True},
                               **run_devices.IN_A_WORKER))
    assert code == 0
    return workdir


def test_a_run_writes_metrics_checkpoints_and_curves(finished_run):
    records = read_metrics(finished_run)
    train = [r for r in records if "loss" in r]
    evals = [r for r in records if "eval_mlm_accuracy" in r]
    assert [r["step"] for r in train] == list(range(1, 13))
    for key in ("loss", "mlm_loss", "mlm_accuracy", "nsp_accuracy", "learning_rate", "seq_len"):
        assert all(np.isfinite(r[key]) for r in train), key
    # Each phase's first step is not timed (tests/test_profiling.py)
    assert [r["step"] for r in train if "tokens_per_sec" not in r] == [1, 9]
    assert [r["seq_len"] for r in train] == [32] * 8 + [64] * 4
    assert [r["step"] for r in evals] == [6, 12]
    assert {r["seq_len"] for r in train[:8]} == {32}
    assert max(int(s) for s in os.listdir(os.path.join(finished_run, "checkpoints"))) == 12
    assert os.path.getsize(os.path.join(finished_run, "curves.png")) > 10_000
    assert os.listdir(os.path.join(finished_run, "tensorboard"))
    bundle = loading.load(finished_run)
    assert bundle.encoder.hidden_size == 128 and bundle.heads["nsp"]


def test_running_a_finished_run_again_does_nothing(finished_run, capsys):
    before = logged(finished_run)
    assert main.main(tiny_args(finished_run, "unused", **run_devices.IN_A_WORKER)) == 0
    assert "already reached step 12" in capsys.readouterr().err
    assert logged(finished_run) == before


def test_a_run_killed_after_a_checkpoint_resumes_bit_identically(tmp_path, small_corpus_dir,
                                                                finished_short_run):
    """The fast tier's resume: SIGKILLed once checkpoint 3 of 6 is on disk, then run again, the
    run logs and ends with what the straight run (finished_short_run) logged and ended with."""
    args = tiny_args(str(tmp_path / "resumed"), small_corpus_dir, **SHORT)
    result = run_child(args, KILL_AFTER_CHECKPOINT=3)
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    result = run_child(args)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "resuming from step 3" in result.stderr
    assert logged(str(tmp_path / "resumed")) == logged(finished_short_run)
    resumed, straight = (flat(loading.load(w).params)
                         for w in (str(tmp_path / "resumed"), finished_short_run))
    assert resumed.keys() == straight.keys()
    for name in straight:
        np.testing.assert_array_equal(resumed[name], straight[name], err_msg=name)


@pytest.mark.slow
def test_exact_resume_after_sigkill_across_the_length_switch(tmp_path, small_corpus_dir):
    straight = str(tmp_path / "straight")
    result = run_child(tiny_args(straight, small_corpus_dir))
    assert result.returncode == 0, result.stderr[-2000:]

    resumed = str(tmp_path / "resumed")
    args = tiny_args(resumed, small_corpus_dir)
    # Killed after the checkpoint of step 5 (short phase), resumed, killed after step 10 (long
    # phase), resumed to the end: the log and the parameters must be those of the straight run.
    for kill_at in (5, 10):
        result = run_child(args, KILL_AFTER_CHECKPOINT=kill_at)
        assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
        assert max(int(s) for s in os.listdir(os.path.join(resumed, "checkpoints"))) == kill_at
    result = run_child(args)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "resuming from step 10" in result.stderr

    assert logged(resumed) == logged(straight)
    a = loading.load(straight).params
    b = loading.load(resumed).params
    flat_a, flat_b = flat(a), flat(b)
    assert flat_a.keys() == flat_b.keys()
    for name in flat_a:
        np.testing.assert_array_equal(flat_a[name], flat_b[name], err_msg=name)


@pytest.mark.slow
def test_sigterm_writes_a_checkpoint_and_exits_0(tmp_path, small_corpus_dir):
    workdir = str(tmp_path / "wd")
    args = tiny_args(workdir, small_corpus_dir, **{"train.steps": 100_000,
                                                   "train.checkpoint_every": 100_000})
    child = subprocess.Popen([sys.executable, "-c", CHILD, *args], env=child_env(),
                                   cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
    metrics = os.path.join(workdir, "metrics.jsonl")
    deadline = time.time() + 240
    while not (os.path.exists(metrics) and len(read_metrics(workdir)) >= 3):
        assert child.poll() is None and time.time() < deadline, child.stderr.read()[-2000:]
        time.sleep(0.2)
    child.send_signal(signal.SIGTERM)
    _, err = child.communicate(timeout=120)
    assert child.returncode == 0, err[-2000:]
    saved = [int(s) for s in os.listdir(os.path.join(workdir, "checkpoints"))]
    assert len(saved) == 1 and 3 <= saved[0] < 100_000
    assert f"stopping after step {saved[0]}" in err


@pytest.mark.parametrize("overrides, message", [
    ({"model.hidden_size": 100, "model.num_heads": 3}, "not divisible"),
    ({"train.steps": 0}, "train.steps must be positive"),
    ({"train.steps": -5}, "train.steps must be positive"),
    ({"model.preset": "huge"}, "unknown model preset"),
    ({"objective": "xlnet"}, "unknown objective"),
    ({"objective": "spanbert"}, "masking.strategy='span'"),
    ({"masking.strategy": "sentence"}, "masking"),
    ({"train.stepz": 3}, "unknown config key"),
    ({"mesh.data": 3}, "mesh"),
])
def test_bad_configs_exit_2_with_one_line(tmp_path, small_corpus_dir, capsys, overrides, message):
    workdir = tmp_path / "wd"
    assert main.main(tiny_args(str(workdir), small_corpus_dir, **overrides)) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bertjax: error:") and "\n" not in err and message in err, err
    assert not workdir.exists()


def snapshot(directory):
    digest = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as f:
                digest[os.path.relpath(path, directory)] = hashlib.sha1(f.read()).hexdigest()
    return digest


def test_a_workdir_of_another_model_is_refused_untouched(finished_run, small_corpus_dir, capsys):
    before = snapshot(finished_run)
    args = tiny_args(finished_run, small_corpus_dir, **{"model.hidden_size": 64,
                                                         "train.steps": 20})
    assert main.main(args) == 2
    err = capsys.readouterr().err
    assert "holds a run with model=" in err and "use a new workdir" in err
    assert snapshot(finished_run) == before


def test_a_checkpoint_of_another_shape_is_refused_even_without_run_record(
        finished_run, small_corpus_dir, tmp_path, capsys):
    # The run record may be lost; the checkpoint's own shapes still protect it.
    import shutil

    copy = str(tmp_path / "copy")
    shutil.copytree(finished_run, copy)
    os.remove(os.path.join(copy, "run.json"))
    before = snapshot(copy)
    args = tiny_args(copy, small_corpus_dir, **{"model.intermediate_size": 256, "train.steps": 20})
    assert main.main(args) == 2
    err = capsys.readouterr().err
    assert "another model shape or vocabulary" in err
    assert "train step at" not in err  # refused before the steps were compiled (and reported)
    after = snapshot(copy)
    after.pop("run.json", None)
    assert after == before


def make_read_only(path):
    if os.geteuid() == 0:  # root ignores permission bits; the immutable attribute binds it too
        subprocess.run(["chattr", "+i", str(path)], check=True)
    else:
        os.chmod(path, 0o555)


def undo_read_only(path):
    if os.geteuid() == 0:
        subprocess.run(["chattr", "-i", str(path)], check=True)
    else:
        os.chmod(path, 0o755)


def test_a_read_only_workdir_exits_2(tmp_path, small_corpus_dir, capsys):
    workdir = tmp_path / "ro"
    workdir.mkdir()
    (workdir / "notes.txt").write_text("keep me")
    make_read_only(workdir)
    try:
        assert main.main(tiny_args(str(workdir), small_corpus_dir)) == 2
    finally:
        undo_read_only(workdir)
    err = capsys.readouterr().err
    assert "is not writable" in err and "\n" not in err.strip()
    assert sorted(os.listdir(workdir)) == ["notes.txt"]


