"""Faults injected into real pretraining runs: a damaged latest checkpoint (fallback), a diverging
run (no non-finite checkpoint, the last finite one kept), a second run on a busy workdir (the
lock), a stop before the first step, and refused commands that must leave the workdir as it was."""

import glob
import hashlib
import os
import shutil
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
from flax import traverse_util

import cli_in_process
from bertjax.inference import loading
from bertjax.train.metrics_log import read_metrics
from pretrain_runs import CHILD, REPO, SHORT, child_env, run_child, tiny_args


def snapshot(directory):
    """Every file under `directory` with the md5 of its bytes."""
    found = {}
    for path in sorted(glob.glob(os.path.join(directory, "**"), recursive=True)):
        if os.path.isfile(path):
            with open(path, "rb") as f:
                found[os.path.relpath(path, directory)] = hashlib.md5(f.read()).hexdigest()
    return found


def one_error_line(err):
    """The one error line (progress lines such as the compile report may precede it)."""
    lines = [line for line in err.strip().splitlines() if line.startswith("bertjax: error:")]
    assert "Traceback" not in err and len(lines) == 1, err[-3000:]
    return lines[0]


def refused_here(args):
    """A run that must be refused before any step, in this process: the refusal is our code's,
    not the process's (the runs that train, resume or take signals are real processes)."""
    return cli_in_process.run(args[0], *args[1:])


@pytest.fixture
def finished(finished_short_run):
    """conftest's finished 6-step run (checkpoints 3 and 6), copied by each test that damages it."""
    return finished_short_run


def copy_of(finished, tmp_path):
    workdir = str(tmp_path / "wd")
    shutil.copytree(finished, workdir)
    return workdir


@pytest.mark.slow
def test_a_damaged_latest_checkpoint_is_set_aside_and_the_previous_one_resumed(
        finished, small_corpus_dir, tmp_path):
    workdir = copy_of(finished, tmp_path)
    arrays = [p for p in glob.glob(os.path.join(workdir, "checkpoints", "6", "state", "**"),
                                   recursive=True) if os.path.isfile(p)]
    largest = max(arrays, key=os.path.getsize)
    with open(largest, "r+b") as f:
        f.truncate(os.path.getsize(largest) // 2)
    resumed = run_child(tiny_args(workdir, small_corpus_dir, **{**SHORT, "train.steps": 8}))
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "checkpoint 6 is unreadable" in resumed.stderr
    assert "resuming from 3" in resumed.stderr
    kept = sorted(os.listdir(os.path.join(workdir, "checkpoints")))
    assert "6.unreadable" in kept and "8" in kept, kept
    assert [r["step"] for r in read_metrics(workdir)] == list(range(1, 9))


@pytest.mark.slow
def test_every_checkpoint_damaged_is_one_line_and_exit_2(finished, small_corpus_dir, tmp_path):
    workdir = copy_of(finished, tmp_path)
    for state in glob.glob(os.path.join(workdir, "checkpoints", "*", "state")):
        shutil.rmtree(state)
    # A real one-device process: the refusal comes after the train state is built, whose compile
    # at this process's 8 devices costs more than a child's start.
    refused = run_child(tiny_args(workdir, small_corpus_dir, **{**SHORT, "train.steps": 8}))
    assert refused.returncode == 2
    assert "restores" in one_error_line(refused.stderr)


@pytest.mark.slow
def test_a_diverging_run_never_saves_a_non_finite_checkpoint(finished, small_corpus_dir, tmp_path):
    """Resumed with an absurd learning rate, checkpointing every step and keeping one: exit 1,
    and checkpoint 6 is still there, pushed out neither by NaN checkpoints nor by finite but
    exploded ones (retention counts only checkpoints whose loss has proven them)."""
    workdir = copy_of(finished, tmp_path)
    shutil.rmtree(os.path.join(workdir, "checkpoints", "3"))
    diverged = run_child(tiny_args(workdir, small_corpus_dir, **{
        **SHORT, "train.steps": 12, "train.checkpoint_every": 1, "train.keep_checkpoints": 1,
        "optimizer.learning_rate": 1e30, "optimizer.warmup_steps": 0}))
    assert diverged.returncode == 1, diverged.stderr[-3000:]
    # Caught by the loss check (one step late) or by the checkpoint's finite check, whichever
    # sees it first; either way nothing non-finite is on disk.
    assert "Traceback" not in diverged.stderr
    assert "diverged" in diverged.stderr or "non-finite" in diverged.stderr
    assert "the newest good checkpoint is step 6" in diverged.stderr, diverged.stderr[-3000:]
    steps = loading.checkpoint_steps(workdir)
    assert 6 in steps, steps
    for step in steps:
        params = traverse_util.flatten_dict(loading.load(workdir, step).params)
        assert all(np.isfinite(leaf).all() for leaf in params.values()), step


@pytest.mark.slow
def test_a_second_run_on_a_busy_workdir_is_refused_naming_the_holder(small_corpus_dir, tmp_path):
    workdir = str(tmp_path / "wd")
    args = tiny_args(workdir, small_corpus_dir, **{"train.steps": 100_000,
                                                   "train.checkpoint_every": 100_000})
    first = subprocess.Popen([sys.executable, "-c", CHILD, *args], env=child_env(),
                                   cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                   text=True)
    try:
        deadline = time.time() + 240
        while not (os.path.exists(os.path.join(workdir, "metrics.jsonl"))
                   and read_metrics(workdir)):
            assert first.poll() is None and time.time() < deadline, first.stderr.read()[-2000:]
            time.sleep(0.2)
        record = snapshot(workdir)["run.json"]
        second = run_child(args)
        assert second.returncode == 2
        line = one_error_line(second.stderr)
        assert "in use" in line and str(first.pid) in line, line
        assert snapshot(workdir)["run.json"] == record
    finally:
        first.send_signal(signal.SIGTERM)
        first.communicate(timeout=120)
    assert first.returncode == 0


@pytest.mark.slow
def test_a_stop_before_the_first_step_exits_0_and_the_same_command_runs(small_corpus_dir,
                                                                        tmp_path):
    workdir = str(tmp_path / "wd")
    args = tiny_args(workdir, small_corpus_dir, **{**SHORT, "train.steps": 2,
                                                   "optimizer.warmup_steps": 1})
    stopped = run_child(args, SIGTERM_DURING_COMPILE=1)
    assert stopped.returncode == 0, stopped.stderr[-3000:]
    assert "stopped before the first step; nothing to save" in stopped.stderr
    assert not loading.checkpoint_steps(workdir)
    again = run_child(args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert loading.checkpoint_steps(workdir) == [2]


@pytest.mark.parametrize("config, overrides, message", [
    ("finetune_sentiment.py", {}, "task"),
    ("tiny.py", {"model.hidden_size": 64, "model.num_heads": 2}, "model"),
    ("tiny.py", {"objective": "roberta"}, "objective"),
])
def test_a_refused_command_leaves_the_workdir_as_it_was(finished, small_corpus_dir, tmp_path,
                                                        config, overrides, message):
    before = snapshot(finished)
    if config.startswith("finetune"):
        data = tmp_path / "x.tsv"
        data.write_text("sentence\tlabel\ngood\t1\nbad\t0\n")
        args = ["bertjax.cli.main", f"--config={REPO}/configs/{config}", f"--workdir={finished}",
                f"--config.init_checkpoint={finished}", f"--config.data.train={data}",
                f"--config.data.eval={data}"]
    else:
        args = tiny_args(finished, small_corpus_dir, **{**SHORT, "train.steps": 8, **overrides})
    refused = refused_here(args)
    assert refused.returncode == 2
    assert message in one_error_line(refused.stderr)
    assert snapshot(finished) == before


def test_refused_commands_create_no_workdir(small_corpus_dir, tmp_path):
    for overrides in ({"schedule.short_seq_len": 1024},
                      {"init_checkpoint": str(tmp_path / "missing")}):
        workdir = str(tmp_path / "new")
        refused = refused_here(tiny_args(workdir, small_corpus_dir, **{**SHORT, **overrides}))
        assert refused.returncode == 2, refused.stderr[-2000:]
        one_error_line(refused.stderr)
        assert not os.path.exists(workdir)


def test_a_truncated_init_checkpoint_is_one_line_and_no_workdir(finished, small_corpus_dir,
                                                                tmp_path):
    source = copy_of(finished, tmp_path)
    for path in glob.glob(os.path.join(source, "checkpoints", "*", "state", "**"),
                          recursive=True):
        if os.path.isfile(path) and os.path.getsize(path) > 1000:
            with open(path, "r+b") as f:
                f.truncate(100)
    workdir = str(tmp_path / "new")
    refused = refused_here(tiny_args(workdir, small_corpus_dir, **{**SHORT,
                                                                "init_checkpoint": source}))
    assert refused.returncode == 2, refused.stderr[-2000:]
    assert "cannot read the checkpoint" in one_error_line(refused.stderr)
    assert not os.path.exists(workdir)
    exported = cli_in_process.run("bertjax.cli.export", "--workdir", source, "--format", "hf",
                                  "--output", str(tmp_path / "out"), "--overwrite")
    assert exported.returncode == 2
    assert "cannot read the checkpoint" in one_error_line(exported.stderr)
    assert not os.path.exists(tmp_path / "out")


def test_a_corrupt_run_record_is_one_line_for_main_and_export(finished, small_corpus_dir,
                                                              tmp_path):
    workdir = copy_of(finished, tmp_path)
    with open(os.path.join(workdir, "run.json"), "w") as f:
        f.write('{"task": "pretrain", "model": {')
    before = snapshot(workdir)
    resumed = refused_here(tiny_args(workdir, small_corpus_dir, **{**SHORT, "train.steps": 8}))
    assert resumed.returncode == 2 and "run.json" in one_error_line(resumed.stderr)
    exported = cli_in_process.run("bertjax.cli.export", "--workdir", workdir, "--format",
                                  "params", "--output", str(tmp_path / "out"))
    assert exported.returncode == 2 and "run.json" in one_error_line(exported.stderr)
    assert snapshot(workdir) == before


@pytest.mark.slow
def test_a_damaged_metrics_line_is_one_line_and_the_workdir_unchanged(finished, small_corpus_dir,
                                                                      tmp_path):
    workdir = copy_of(finished, tmp_path)
    path = os.path.join(workdir, "metrics.jsonl")
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    lines[2] = b"\x00garbage{{"
    with open(path, "wb") as f:
        f.write(b"\n".join(lines))
    before = snapshot(workdir)
    refused = refused_here(tiny_args(workdir, small_corpus_dir, **{**SHORT, "train.steps": 8}))
    assert refused.returncode == 2
    assert f"{path} line 3 is not a metrics record" in one_error_line(refused.stderr)
    assert snapshot(workdir) == before
