"""Every environment variable bertjax reads is checked before the first write: given nan, inf, 0,
-1, text and the empty string, `python -m bertjax.main` refuses it in one line naming it (exit 2,
the workdir not created, nothing written), or the table below accepts the value, with the
reason, and the run reaches the workdir's opening without a word (docs/reliability.md lists
the variables and their valid values).

The command runs in this process (cli_in_process) with RunDirectory.open, the job's first write,
replaced by a stop, and jax.distributed.initialize by a recorder (a job of one process would
otherwise join this test process to it). JAX_PLATFORMS and XLA_FLAGS are what JAX and XLA read
as a process starts, so their refusals are also run in child processes: there the check must
come before JAX fails with a traceback or XLA aborts.
"""

import os
import subprocess
import sys

import jax
import pytest

import cli_in_process
from bertjax.jobs import run_directory

pytestmark = pytest.mark.slow

VALUES = ("nan", "inf", "0", "-1", "lots", "")
REPO = cli_in_process.REPO

# A job of one process, as JAX_* describes it; each JAX_* case changes one of these.
ONE_PROCESS = {"JAX_COORDINATOR_ADDRESS": "127.0.0.1:12345", "JAX_NUM_PROCESSES": "1",
               "JAX_PROCESS_ID": "0"}
# Inside a SLURM step, where the task counts are read.
SLURM_STEP = {"SLURM_STEP_NODELIST": "localhost", "SLURM_PROCID": "0"}
CONTEXT = {name: ONE_PROCESS for name in (*ONE_PROCESS, "JAX_LOCAL_DEVICE_IDS")}
CONTEXT.update({name: SLURM_STEP for name in ("SLURM_NTASKS", "SLURM_STEP_NUM_TASKS")})

EMPTY_IS_UNSET = "empty is unset: the default"
# (variable, value) -> why the value is a valid one. Anything not here must be refused.
ACCEPTED = {
    **{(name, ""): EMPTY_IS_UNSET for name in (
        "BERTJAX_STORAGE_TIMEOUT", "BERTJAX_CACHE", "BERTJAX_PEER_TIMEOUT", "STORAGE_EMULATOR_HOST",
        "XLA_FLAGS",
        "JAX_PLATFORMS", "JAX_LOCAL_DEVICE_IDS", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS")},
    ("JAX_PROCESS_ID", "0"): "process 0 of the job's one process",
    ("JAX_LOCAL_DEVICE_IDS", "0"): "device 0 of this host",
    **{("TFDS_DATA_DIR", value): "TFDS's own directory (read only with tfds: inputs; a "
       "relative one is resolved from the current directory, as TFDS does)" for value in VALUES},
    **{("TOKENIZERS_PARALLELISM", value): "the tokenizers library's: any value but empty, "
       "off, false, f, no, n, 0 turns its thread pool on" for value in VALUES},
}
VARIABLES = ("BERTJAX_STORAGE_TIMEOUT", "BERTJAX_CACHE", "BERTJAX_PEER_TIMEOUT", "TFDS_DATA_DIR",
             "JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID",
             "JAX_LOCAL_DEVICE_IDS", "SLURM_NTASKS", "SLURM_STEP_NUM_TASKS",
             "STORAGE_EMULATOR_HOST", "XLA_FLAGS", "JAX_PLATFORMS", "TOKENIZERS_PARALLELISM")
READ_AT_PROCESS_START = ("XLA_FLAGS", "JAX_PLATFORMS")


class Stopped(BaseException):
    """Raised where the job would create its workdir: the value got past every check."""


def _workdir(name: str, value: str, tmp_path) -> str:
    # The emulator's address is read only for gs:// paths.
    if name == "STORAGE_EMULATOR_HOST" and value:
        return "gs://bucket/run"
    return str(tmp_path / "workdir")


def _problems_of_refusal(done, name: str, value: str) -> list[str]:
    lines = done.stderr.splitlines()
    if (done.returncode == 2 and len(lines) == 1 and lines[0].startswith("bertjax: error: ")
            and name in lines[0]):
        return []
    return [f"{name}={value!r}: exit {done.returncode}, stderr {done.stderr[-600:]!r}"]


def _environment(monkeypatch, name: str, value: str) -> None:
    for context_name in ("SLURM_NTASKS", "SLURM_STEP_NUM_TASKS", *CONTEXT.get(name, {})):
        monkeypatch.delenv(context_name, raising=False)
    for context_name, context_value in CONTEXT.get(name, {}).items():
        monkeypatch.setenv(context_name, context_value)
    monkeypatch.setenv(name, value)


@pytest.mark.parametrize("name", VARIABLES)
def test_each_value_refused_in_one_line_or_accepted(name, monkeypatch, tmp_path,
                                                    small_corpus_dir):
    joined = []
    def stop(self):
        raise Stopped(self.path)
    monkeypatch.setattr(run_directory.RunDirectory, "open", stop)
    monkeypatch.setattr(jax.distributed, "initialize", lambda **kw: joined.append(kw))
    found = []
    for value in VALUES:
        with monkeypatch.context() as m:
            _environment(m, name, value)
            case = tmp_path / f"case-{VALUES.index(value)}"
            case.mkdir()
            workdir = _workdir(name, value, case)
            args = ["--config=configs/tiny.py", f"--workdir={workdir}",
                    f"--config.data.prepared={small_corpus_dir}"]
            try:
                done = cli_in_process.run("main", *args)
            except Stopped:
                done = None
        if (name, value) in ACCEPTED:
            if done is not None:
                found.append(f"{name}={value!r} ({ACCEPTED[name, value]}) did not reach the "
                             f"workdir: exit {done.returncode}, {done.stderr[-600:]!r}")
            continue
        if done is None:
            found.append(f"{name}={value!r} reached the workdir's opening")
            continue
        found += _problems_of_refusal(done, name, value)
        if os.listdir(case):
            found.append(f"{name}={value!r}: {os.listdir(case)} written")
    assert found == []
    if name in ("JAX_PROCESS_ID", "JAX_LOCAL_DEVICE_IDS"):  # the accepted values reached JAX
        assert [(kw["process_id"], kw["num_processes"]) for kw in joined] == [(0, 1)] * len(joined)
        assert len(joined) == (1 if name == "JAX_PROCESS_ID" else 2)


@pytest.mark.parametrize("name", READ_AT_PROCESS_START)
def test_refused_before_jax_starts_in_a_fresh_process(name, tmp_path, small_corpus_dir):
    """The refusal comes before JAX's backends start (an unknown platform is a traceback there,
    an XLA_FLAGS value not starting `--` an abort)."""
    found = []
    for value in VALUES:
        if (name, value) in ACCEPTED:
            continue
        workdir = tmp_path / f"workdir-{VALUES.index(value)}"
        env = dict(os.environ, **{name: value})
        done = subprocess.run(
            [sys.executable, "-m", "bertjax.main", "--config=configs/tiny.py",
             f"--workdir={workdir}", f"--config.data.prepared={small_corpus_dir}"],
            cwd=REPO, env=env, capture_output=True, text=True, timeout=300)
        found += _problems_of_refusal(done, name, value)
        if workdir.exists():
            found.append(f"{name}={value!r}: the workdir was created")
    assert found == []
