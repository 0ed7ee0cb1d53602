"""Outputs (bertjax.core.output_dir) under the faults that used to lose or leave files: two
commands finishing the same output at once, --overwrite aimed at something that is not an output
of the command's kind or at one of its inputs, a full disk (a real tmpfs), SIGTERM mid-write, and
non-finite settings."""

import os
import shlex
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import cli_in_process
from bertjax.core import no_replace, output_dir
from bertjax.core.errors import UserError
from faults.file_trees import md5s
from faults.test_inputs import _mount_runner
from pretrain_runs import REPO, child_env

MARKER = "made-by-test"
KIND = output_dir.Kind("test output", directory=True,
                       holds=lambda path: os.path.isfile(os.path.join(path, MARKER)))
FILE_KIND = output_dir.Kind("test file", directory=False,
                            holds=lambda path: open(path).read().startswith("test"))


def _write_output(staging: str, content: str) -> None:
    with open(os.path.join(staging, MARKER), "w") as f:
        f.write(content)


def _leftovers(directory) -> list[str]:
    return [name for name in os.listdir(directory) if ".tmp-" in name or ".old-" in name]


@pytest.mark.parametrize("portable", [False, True], ids=["renameat2", "portable"])
def test_the_second_of_two_writers_is_refused_and_the_first_output_stays(tmp_path, monkeypatch,
                                                                          portable):
    if portable:
        monkeypatch.setattr(no_replace, "_renameat2", None)
    target = str(tmp_path / "out")
    with pytest.raises(UserError, match="already exists .another command wrote it meanwhile"):
        with output_dir.staged(target, overwrite=False, kind=KIND) as slow:
            with output_dir.staged(target, overwrite=False, kind=KIND) as fast:
                _write_output(fast, "fast")
            _write_output(slow, "slow")
    assert open(os.path.join(target, MARKER)).read() == "fast"
    assert _leftovers(tmp_path) == []

    path = str(tmp_path / "out.txt")
    with pytest.raises(UserError, match="already exists"):
        with output_dir.staged_file(path, overwrite=False, kind=FILE_KIND, mode="w") as slow:
            with output_dir.staged_file(path, overwrite=False, kind=FILE_KIND, mode="w") as fast:
                fast.write("test fast")
            slow.write("test slow")
    assert open(path).read() == "test fast" and _leftovers(tmp_path) == []


def test_overwrite_replaces_only_an_output_of_the_same_kind(tmp_path):
    workdir = tmp_path / "workdir"
    (workdir / "checkpoints").mkdir(parents=True)
    (workdir / "run.json").write_text("{}")
    before = md5s(str(workdir))
    with pytest.raises(UserError, match="is not a test output; --overwrite replaces only"):
        with output_dir.staged(str(workdir), overwrite=True, kind=KIND) as staging:
            _write_output(staging, "new")
    assert md5s(str(workdir)) == before and (workdir / "checkpoints").is_dir()

    ours = str(tmp_path / "ours")
    for content in ("old", "new"):
        with output_dir.staged(ours, overwrite=True, kind=KIND) as staging:
            _write_output(staging, content)
    assert open(os.path.join(ours, MARKER)).read() == "new" and _leftovers(tmp_path) == []

    other_file = tmp_path / "notes.txt"
    other_file.write_text("my notes")
    with pytest.raises(UserError, match="is not a test file"):
        output_dir.check_target(str(other_file), overwrite=True, kind=FILE_KIND)


def test_an_output_never_replaces_or_enters_an_input(tmp_path):
    model = tmp_path / "model"
    model.mkdir()
    (model / MARKER).write_text("an output of this kind, but also the input")
    queries = tmp_path / "q.txt"
    queries.write_text("test queries")
    cases = [(str(model), str(model), "would replace the input"),
             (str(tmp_path), str(model), "would replace the input"),
             (str(model / "inside"), str(model), "inside the input")]
    for target, source, phrase in cases:
        with pytest.raises(UserError, match=phrase):
            output_dir.check_target(target, overwrite=True, kind=KIND, sources=(source,))
    with pytest.raises(UserError, match="would replace the input"):
        output_dir.check_target(str(queries), overwrite=True, kind=FILE_KIND,
                                sources=(str(queries),))


def test_search_output_onto_its_own_queries_is_refused(tmp_path):
    queries = tmp_path / "q.txt"
    queries.write_text("a query\n")
    before = md5s(str(tmp_path))
    done = cli_in_process.run("index", "search", "--index", str(tmp_path / "no-index"),
                              "--queries", str(queries), "--output", str(queries), "--overwrite")
    assert done.returncode == 2 and len(done.stderr.splitlines()) == 1, done.stderr
    assert md5s(str(tmp_path)) == before


@pytest.mark.parametrize("setting", ["distill.temperature=inf", "distill.alpha=nan"])
def test_a_non_finite_setting_is_refused_before_anything_is_written(tmp_path, setting):
    workdir = tmp_path / "wd"
    done = cli_in_process.run("main", f"--config={REPO}/configs/distill.py",
                              f"--workdir={workdir}", f"--config.{setting}")
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines() == [
        f"bertjax: error: {setting.split('=')[0]} must be a finite number, got "
        f"{setting.split('=')[1]}"]
    assert not workdir.exists()


def _on_a_tmpfs(disk, size: str, steps: str, tmp_path) -> None:
    """Runs the shell `steps` with a fresh tmpfs of `size` mounted at `disk` (in a private mount
    namespace: it goes with the process), then unmounts it."""
    disk.mkdir()
    script = f"""
        export PYTHONPATH={shlex.quote(REPO)}
        mount -t tmpfs -o size={size} tmpfs {shlex.quote(str(disk))} || exit 99
        {steps}
        umount {shlex.quote(str(disk))}
    """
    ran = subprocess.run(_mount_runner(str(disk)) + ["sh", "-c", script], capture_output=True,
                         text=True, cwd=REPO, env=child_env(), timeout=300)
    assert ran.returncode == 0, ran.stderr


def _command(*args: str) -> str:
    return " ".join(shlex.quote(a) for a in (sys.executable, "-m", *args))


def _texts(path, count: int) -> str:
    words = "the film was good bad long short and a plot actor scene".split()
    lines = [" ".join(words[(i * 7 + j) % len(words)] for j in range(12)) for i in range(count)]
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.slow
def test_a_full_or_read_only_disk_while_embedding_is_one_line_and_leaves_nothing(
        tmp_path, finished_short_run):
    disk = tmp_path / "disk"
    texts = _texts(tmp_path / "texts.txt", 3000)  # 3000 x 128 fp32: 1.5 MB on a 256 KiB disk
    embed = _command("bertjax.embed", "--model", finished_short_run, "--input", texts,
                     "--output", str(disk / "vectors.npy"), "--pooling", "mean")
    _on_a_tmpfs(disk, "256k", f"""
        echo kept > {shlex.quote(str(disk / "older.txt"))}
        {embed} >{tmp_path}/out 2>{tmp_path}/err; echo $? >{tmp_path}/rc
        ls -a {shlex.quote(str(disk))} > {tmp_path}/ls
        cat {shlex.quote(str(disk / "older.txt"))} > {tmp_path}/older
        mount -o remount,ro {shlex.quote(str(disk))}
        {embed.replace("vectors.npy", "other.npy")} 2>{tmp_path}/err_ro; echo $? >{tmp_path}/rc_ro
    """, tmp_path)
    err = (tmp_path / "err").read_text()
    assert (tmp_path / "rc").read_text().strip() == "2", err
    assert len(err.splitlines()) == 1 and "no space left on the device writing" in err, err
    assert "free there" in err and "Traceback" not in err
    assert sorted((tmp_path / "ls").read_text().split()) == [".", "..", "older.txt"]
    assert (tmp_path / "older").read_text() == "kept\n"
    # A read-only file system: one line naming the output, before the model is even loaded.
    err = (tmp_path / "err_ro").read_text()
    assert (tmp_path / "rc_ro").read_text().strip() == "2", err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("bertjax: error: cannot write"), err
    assert "other.npy" in lines[0] and "Read-only file system" in lines[0], err


@pytest.mark.slow
def test_sigterm_while_embedding_removes_the_unfinished_output(tmp_path, finished_short_run):
    texts = _texts(tmp_path / "texts.txt", 20000)
    output = tmp_path / "out" / "vectors.npy"
    output.parent.mkdir()
    process = subprocess.Popen(
        [sys.executable, "-m", "bertjax.embed", "--model", finished_short_run, "--input", texts,
         "--output", str(output), "--pooling", "mean"], cwd=REPO, env=child_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and process.poll() is None and \
            not _leftovers(output.parent):
        time.sleep(0.05)
    assert _leftovers(output.parent), "the staging file never appeared"
    time.sleep(1.0)  # into the model's loading and the embedding
    process.send_signal(signal.SIGTERM)
    out, err = process.communicate(timeout=120)
    assert process.returncode == 143, err
    assert err.splitlines() == ["bertjax: stopped by SIGTERM before the output was complete; the "
                                "unfinished output was removed and nothing older was changed"]
    assert os.listdir(output.parent) == []


def test_the_vectors_written_are_the_ones_a_plain_save_writes(tmp_path):
    """The staged file is a complete .npy: what np.load reads back is what was saved."""
    vectors = np.arange(12, dtype=np.float32).reshape(3, 4)
    path = str(tmp_path / "v.npy")
    kind = output_dir.Kind("npy", directory=False, holds=lambda p: True)
    with output_dir.staged_file(path, overwrite=False, kind=kind) as f:
        np.save(f, vectors)
    np.testing.assert_array_equal(np.load(path), vectors)
    assert oct(os.stat(path).st_mode & 0o777) != oct(0o600)


@pytest.mark.slow
def test_an_index_that_cannot_fit_is_refused_before_a_byte_is_written(tmp_path,
                                                                       finished_short_run):
    """5,000 documents on a 2 MB file system: once the end of a SIGBUS and a staging directory
    filling the disk (a writable memory map), now one line before anything is written."""
    disk = tmp_path / "disk"
    corpus = tmp_path / "docs.jsonl"
    corpus.write_text("".join(f'{{"id": "d{i}", "text": "document {i} about the film"}}\n'
                              for i in range(5000)))
    build = _command("bertjax.index", "build", "--model", finished_short_run, "--corpus",
                     str(corpus), "--output", str(disk / "index"), "--approximate")
    _on_a_tmpfs(disk, "2m", f"""
        {build} >{tmp_path}/out 2>{tmp_path}/err; echo $? >{tmp_path}/rc
        ls -a {shlex.quote(str(disk))} > {tmp_path}/ls
    """, tmp_path)
    err = (tmp_path / "err").read_text()
    assert (tmp_path / "rc").read_text().strip() == "2", err
    assert len(err.splitlines()) == 1 and "needs about" in err and "free" in err, err
    assert sorted((tmp_path / "ls").read_text().split()) == [".", ".."]
