"""A TPU pod slice on one machine: two processes joined by jax.distributed share nothing but a
bucket (the local GCS server, tests/gcs_emulator.py), which holds the corpus and the workdir.

One run goes straight to the end through launch/local.sh. Another loses process 1 (SIGKILL) after
a checkpoint while a second job on its workdir is refused by the lease; the survivor leaves with
one line and EXIT_PEER_LOST within its stated bound, and launch/local.sh resumes the job from the
bucket to the straight run's losses, bit for bit. Process 1 names the server `localhost`, process
0 `127.0.0.1`: the server's log of changes tells their writes apart, and only process 0 writes
the run's records. A peer that freezes instead (SIGSTOP) ends the other within
BERTJAX_PEER_TIMEOUT, in one line too.
"""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest

from bertjax.core import storage
from bertjax.inference import loading
from bertjax.parallel import peer_loss
from cli_in_process import run as run_in_process
from gcs_emulator import emulator_env
from pretrain_runs import CHILD_XLA_FLAGS, REPO, SHORT, tiny_args
from test_gcs_runs import bucket_corpus  # noqa: F401 (the corpus prepared into a bucket)
from test_multihost import base_env, free_port

pytestmark = [pytest.mark.multiprocess, pytest.mark.gcs]

PEER_TIMEOUT_S = 30
# The survivor's stated bound (docs/scaling-out.md): at once where the collective fails, else
# BERTJAX_PEER_TIMEOUT; plus its clean-up, cut short after BERTJAX_PEER_TIMEOUT.
SURVIVOR_BOUND_S = 2 * PEER_TIMEOUT_S
WAIT_S = 300  # any one process: far beyond a tiny run, short of a stalled suite

# The job, with HOLD_AFTER_CHECKPOINT=N: the process parks once checkpoint N is saved (marker file
# written), so the test kills it at a known point while the other waits in the next step.
CHILD = textwrap.dedent("""
    import os, sys, time
    from bertjax.train import checkpoint
    hold_at = int(os.environ.get("HOLD_AFTER_CHECKPOINT", "0"))
    save = checkpoint.Checkpointer.save
    def save_then_maybe_hold(self, step, state, data_state, **kwargs):
        result = save(self, step, state, data_state, **kwargs)
        if step == hold_at:
            self.wait()
            open(os.environ["HOLD_MARKER"], "w").close()
            time.sleep(3600)
        return result
    checkpoint.Checkpointer.save = save_then_maybe_hold
    from bertjax.cli import main
    sys.exit(main.main(["bertjax.cli.main", *sys.argv[1:]]))
""")


def job_args(workdir, corpus):
    """SHORT: 6 steps, checkpoints 3 and 6; one CPU device per process, data parallel."""
    return tiny_args(workdir, corpus, **SHORT)[1:]


def process_env(gcs, index, port=None, **extra):
    """Process `index`'s environment; process 1 names the server localhost."""
    env = base_env(**{"BERTJAX_PEER_TIMEOUT": PEER_TIMEOUT_S, "XLA_FLAGS": CHILD_XLA_FLAGS,
                      **extra})
    server = gcs.env()
    if index == 1:
        server = emulator_env(f"localhost:{gcs.port}")
    env.update(server)
    if port is not None:
        env.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES="2",
                   JAX_PROCESS_ID=str(index))
    return env


def start_pair(gcs, args, logs, hold=None):
    """Processes 0 and 1 of the job, each its output to its log; `hold`: process 1's
    (checkpoint step, marker path) to park at."""
    port, procs = free_port(), []
    for i in (0, 1):
        extra = {}
        if i == 1 and hold is not None:
            extra = {"HOLD_AFTER_CHECKPOINT": hold[0], "HOLD_MARKER": hold[1]}
        with open(logs[i], "w") as log:
            procs.append(subprocess.Popen([sys.executable, "-c", CHILD, *args],
                                          env=process_env(gcs, i, port, **extra), cwd=REPO,
                                          stdout=log, stderr=subprocess.STDOUT))
    return procs


def launch_local(gcs, args):
    """`launch/local.sh --processes=2`, as an operator restarts a job; both processes see the
    server as 127.0.0.1."""
    return subprocess.run(
        ["bash", os.path.join(REPO, "launch", "local.sh"), "--processes=2",
         f"--port={free_port()}", f"--python={sys.executable}", "--", *args],
        env=process_env(gcs, 0), cwd=REPO, capture_output=True, text=True, timeout=WAIT_S)


def losses(workdir):
    raw = storage.read_bytes(storage.join(workdir, "metrics.jsonl")).decode()
    return [(r["step"], r["loss"]) for r in map(json.loads, raw.splitlines()) if "loss" in r]


def errors(text):
    return [line for line in text.splitlines() if line.startswith("bertjax: error:")]


def object_names(gcs, bucket, host):
    """The objects of `bucket` that requests naming the server `host` wrote or deleted."""
    return {name.split("/", 1)[1] for sender, _, name in gcs.changes()
            if sender.split(":")[0] == host and name.startswith(f"{bucket}/")}


def run_straight(gcs, workdir, corpus, logs):
    started = time.monotonic()
    procs = start_pair(gcs, job_args(workdir, corpus), logs)
    try:
        codes = [p.wait(timeout=WAIT_S) for p in procs]
    finally:
        for p in procs:
            p.kill()
    assert codes == [0, 0], [log.read_text()[-3000:] for log in logs]
    print(f"straight 2-process run: {time.monotonic() - started:.1f}s")


def lose_process_one(gcs, workdir, corpus, logs, marker):
    """Process 1 parks after checkpoint 3 while process 0 goes on into step 4 and waits there
    for it; a second job is refused by process 0's lease; then process 1 is SIGKILLed. Returns
    the survivor's exit status and how long after the kill it left."""
    procs = start_pair(gcs, job_args(workdir, corpus), logs, hold=(3, marker))
    try:
        deadline = time.monotonic() + WAIT_S
        while not marker.exists():
            assert all(p.poll() is None for p in procs), [log.read_text()[-3000:] for log in logs]
            assert time.monotonic() < deadline, [log.read_text()[-3000:] for log in logs]
            time.sleep(0.2)
        second = subprocess.run([sys.executable, "-m", "bertjax.main", *job_args(workdir, corpus)],
                                env=process_env(gcs, 0), cwd=REPO, capture_output=True,
                                text=True, timeout=WAIT_S)
        assert second.returncode == 2, second.stderr[-3000:]
        assert len(errors(second.stderr)) == 1 and "Traceback" not in second.stderr
        assert f"workdir {workdir} is in use by pid {procs[0].pid}" in second.stderr

        procs[1].send_signal(signal.SIGKILL)
        killed = time.monotonic()
        assert procs[1].wait(timeout=WAIT_S) == -signal.SIGKILL
        code = procs[0].wait(timeout=SURVIVOR_BOUND_S + 60)
        return code, time.monotonic() - killed
    finally:
        for p in procs:
            p.kill()
            p.wait(timeout=WAIT_S)


def test_two_hosts_on_one_bucket_lose_one_resume_and_match_the_straight_run(
        gcs, gcs_bucket, bucket_corpus, tmp_path):
    straight, workdir = f"gs://{gcs_bucket}/straight", f"gs://{gcs_bucket}/killed"
    logs = [tmp_path / f"process-{i}.log" for i in (0, 1)]
    run_straight(gcs, straight, bucket_corpus, logs)
    assert loading.checkpoint_steps(straight) == [3, 6]
    raw = storage.read_bytes(storage.join(straight, "metrics.jsonl")).decode()
    fetched = [r.get("data_bytes_fetched", 0) for r in map(json.loads, raw.splitlines())
               if "loss" in r]
    assert sum(fetched) > 0, fetched  # the corpus was read in place from the bucket

    code, left_after = lose_process_one(gcs, workdir, bucket_corpus, logs, tmp_path / "held")
    print(f"survivor left {left_after:.1f}s after the SIGKILL")
    survivor = logs[0].read_text()
    assert code == peer_loss.EXIT_PEER_LOST, survivor[-3000:]
    assert errors(survivor) == [survivor.rstrip().splitlines()[-1]], survivor[-3000:]
    assert "lost contact with another process of this 2-process job" in survivor
    assert "Traceback" not in survivor and "Check failure" not in survivor
    assert left_after < SURVIVOR_BOUND_S
    assert loading.checkpoint_steps(workdir) == [3]
    assert not storage.exists(f"{workdir}/.lock")  # released by the survivor on its way out

    # Only process 0 wrote the run's records and the lease; process 1 only its checkpoint shards.
    zero, one = (object_names(gcs, gcs_bucket, host) for host in ("127.0.0.1", "localhost"))
    for run in ("straight", "killed"):
        assert {f"{run}/run.json", f"{run}/metrics.jsonl", f"{run}/.lock"} <= zero, zero
        assert any(n.startswith(f"{run}/tensorboard/") for n in zero), zero
        assert any(n.startswith(f"{run}/checkpoints/") for n in one), one
    assert all(n.startswith(("straight/checkpoints/", "killed/checkpoints/")) for n in one), one

    # Started again as an operator would: resumed from the bucket, to the straight run's losses.
    started = time.monotonic()
    done = launch_local(gcs, job_args(workdir, bucket_corpus))
    assert done.returncode == 0, done.stderr[-3000:]
    print(f"resumed 2-process run: {time.monotonic() - started:.1f}s")
    assert "resuming from step 3 of 6" in done.stderr
    assert [step for step, _ in losses(workdir)] == [1, 2, 3, 4, 5, 6]
    assert losses(workdir) == losses(straight)


@pytest.mark.parametrize("value", ["0", "-5", "1.5", "soon"])
def test_a_bad_peer_timeout_is_refused_before_the_workdir(monkeypatch, tmp_path, value,
                                                          small_corpus_dir):
    monkeypatch.setenv(peer_loss.PEER_TIMEOUT_VARIABLE, value)
    workdir = tmp_path / "run"
    done = run_in_process("main", *job_args(str(workdir), small_corpus_dir))
    assert done.returncode == 2
    assert errors(done.stderr) == [
        f"bertjax: error: BERTJAX_PEER_TIMEOUT={value!r} must be a whole number of seconds of "
        "at least 1 (how long a multi-process job waits for a silent process)"]
    assert not workdir.exists()


# Two processes joined as a job is (bertjax.parallel.distributed), gathering in a loop; process 1
# writes MARKER once both are at it.
GATHERING = textwrap.dedent("""
    import os, time
    import numpy as np
    from bertjax.parallel import distributed
    distributed.initialize_from_environment()
    from jax.experimental import multihost_utils
    for i in range(1000000):
        multihost_utils.process_allgather(np.int32(i))
        if i == 10 and os.environ.get("MARKER"):
            open(os.environ["MARKER"], "w").close()
        time.sleep(0.05)
""")


def test_a_peer_that_stops_answering_ends_the_other_in_one_line_within_the_timeout(
        gcs, tmp_path):
    """A frozen host (SIGSTOP): its connections stay open and the collective waits; the survivor
    leaves once the peer has been silent for BERTJAX_PEER_TIMEOUT, before JAX's own verdict."""
    timeout_s, marker, port = 8, tmp_path / "gathering", free_port()
    procs = []
    for i in (0, 1):
        env = process_env(gcs, i, port, BERTJAX_PEER_TIMEOUT=timeout_s,
                          **({"MARKER": marker} if i == 1 else {}))
        procs.append(subprocess.Popen([sys.executable, "-c", GATHERING], env=env, cwd=REPO,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    try:
        deadline = time.monotonic() + WAIT_S
        while not marker.exists():
            assert all(p.poll() is None for p in procs)
            assert time.monotonic() < deadline
            time.sleep(0.1)
        procs[1].send_signal(signal.SIGSTOP)
        frozen = time.monotonic()
        _, err = procs[0].communicate(timeout=4 * timeout_s)
        left_after = time.monotonic() - frozen
    finally:
        for p in procs:
            p.kill()
            p.communicate(timeout=WAIT_S)
    print(f"survivor left {left_after:.1f}s after its peer froze (BERTJAX_PEER_TIMEOUT="
          f"{timeout_s})")
    assert procs[0].returncode == peer_loss.EXIT_PEER_LOST, err[-3000:]
    assert errors(err) == [
        f"bertjax: error: lost contact with process 1 of this 2-process job (silent for "
        f"{timeout_s}s, BERTJAX_PEER_TIMEOUT); start the job again on every host: it resumes "
        "from the last checkpoint"], err[-3000:]
    assert "Terminating process" not in err
    assert left_after < 2 * timeout_s  # JAX's own verdict would come at twice the timeout
