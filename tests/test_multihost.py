"""The multi-host path on one machine: 2 processes x 4 fake CPU devices joined by
jax.distributed over 127.0.0.1 train a tiny BERT on a (data=2, fsdp=2, tensor=2) mesh that spans
both, checkpoint, are SIGKILLed, resume, stop together when only one of them gets SIGTERM, resume
again through launch/local.sh, and end where a 1-process 8-device run of the same mesh ends.

What is asserted, and why not bit-identity: both runs execute the same SPMD program on the same
global batches, but their all-reduces differ (gloo across processes vs XLA:CPU's in-process
collectives), and a float sum's value depends on its order. Measured: metrics differ by at most
5e-7 relative, parameters by 1.2e-7 (one float32 ulp near 1) after 8 steps. Asserted: metrics to
rel 1e-5 and parameters to atol 1e-6, margins of 8-20x that are still far below
what one step changes (~1e-3 per parameter at lr 1e-3): a wrong batch slice, a lost or repeated
step or a mis-restored state fails by orders of magnitude. Within the multi-process run resuming
is exact by construction (tested bit for bit on one process in test_pretrain.py).
"""

import os
import re
import signal
import socket
import subprocess
import sys
import textwrap
import time

import numpy as np
import pytest

from bertjax.inference import loading
from bertjax.core.errors import UserError
from bertjax.interop import params_dir
from bertjax.parallel import distributed
from bertjax.train.metrics_log import read_metrics
from bertjax.train.step_timing import TIMING_FIELDS
from pretrain_runs import CHILD_XLA_FLAGS
from trees import flat

pytestmark = pytest.mark.multiprocess

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STEPS = 8
# The least XLA:CPU compile work (pretrain_runs.CHILD_XLA_FLAGS): compiling dominates these runs.
# Every run here uses the same flags (the device count aside).
FAST_FLAGS = CHILD_XLA_FLAGS

# The job with two test hooks: HOLD_AFTER_CHECKPOINT=N parks the process (marker file written)
# once the checkpoint of step N is on disk, so the test can SIGKILL every process at a known
# point; SIGTERM_AFTER_STEP=N makes this process send itself SIGTERM after step N.
CHILD = textwrap.dedent("""
    import os, signal, sys, time
    from bertjax.train import checkpoint, loop
    hold_at = int(os.environ.get("HOLD_AFTER_CHECKPOINT", "0"))
    sigterm_at = int(os.environ.get("SIGTERM_AFTER_STEP", "0"))
    save = checkpoint.Checkpointer.save
    def save_then_maybe_hold(self, step, state, data_state, **kwargs):
        result = save(self, step, state, data_state, **kwargs)
        if step == hold_at:
            self.wait()
            marker = os.path.join(os.environ["MARKER_DIR"], "held-" + os.environ["JAX_PROCESS_ID"])
            open(marker, "w").close()
            time.sleep(3600)
        return result
    checkpoint.Checkpointer.save = save_then_maybe_hold
    run = loop.run
    def run_and_maybe_sigterm(state, batches, *, step_fn, start_step, **kwargs):
        done = [start_step]
        def counting_step(state, batch):
            result = step_fn(state, batch)
            done[0] += 1
            if done[0] == sigterm_at:
                os.kill(os.getpid(), signal.SIGTERM)
            return result
        return run(state, batches, step_fn=counting_step, start_step=start_step, **kwargs)
    loop.run = run_and_maybe_sigterm
    from bertjax.cli import main
    sys.exit(main.main(["bertjax.cli.main", *sys.argv[1:]]))
""")


def job_args(workdir, corpus_dir):
    settings = {
        "data.prepared": corpus_dir, "data.workers": 0, "train.steps": STEPS,
        "train.batch_size": 8, "schedule.short_seq_len": 32, "schedule.short_max_predictions": 5,
        "schedule.long_fraction": 0, "train.log_every": 1, "train.checkpoint_every": 2,
        "train.eval_every": 4, "train.eval_batches": 1, "optimizer.warmup_steps": 2,
        "mesh.data": 2, "mesh.fsdp": 2, "mesh.tensor": 2,
    }
    return [f"--config={REPO}/configs/tiny.py", f"--workdir={workdir}"] + [
        f"--config.{k}={v}" for k, v in settings.items()]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


# What a launcher or scheduler sets to join a process to a job (bertjax.parallel reads them).
JOB_VARIABLES = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID",
                 "JAX_LOCAL_DEVICE_IDS")


def base_env(**extra):
    """The suite's environment (its compilation cache among it) less any multi-process
    settings a scheduler left there, plus `extra`."""
    env = {k: v for k, v in os.environ.items()
           if not k.startswith("SLURM_") and k not in JOB_VARIABLES}
    env.update(XLA_FLAGS=FAST_FLAGS)
    env.update({k: str(v) for k, v in extra.items()})
    return env


def start(args, env, log_path):
    """A process of the job, its output to `log_path`."""
    with open(log_path, "w") as log:
        return subprocess.Popen([sys.executable, "-c", CHILD, *args], env=env, cwd=REPO,
                                      stdout=log, stderr=subprocess.STDOUT)


def start_pair(args, logs, **per_process):
    """Processes 0 and 1 of a 2-process job, 4 CPU devices each; per_process[k] = (v0, v1)."""
    port = free_port()
    procs = []
    for i in (0, 1):
        extra = {k: v[i] for k, v in per_process.items() if v[i] is not None}
        env = base_env(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
                       JAX_NUM_PROCESSES=2, JAX_PROCESS_ID=i, **extra)
        env["XLA_FLAGS"] += " --xla_force_host_platform_device_count=4"
        procs.append(start(args, env, logs[i]))
    return procs


def read(path):
    with open(path) as f:
        return f.read()


def finish(procs, logs, timeout=300):
    codes = [p.wait(timeout=timeout) for p in procs]
    return codes, [read(path) for path in logs]


def saved_steps(workdir):
    directory = os.path.join(workdir, "checkpoints")
    return sorted(int(s) for s in os.listdir(directory) if s.isdigit())


def logged(workdir):
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in read_metrics(workdir)]


def test_two_processes_checkpoint_die_resume_stop_together_and_match_one_process(
        tmp_path, small_corpus_dir):
    reference_dir, workdir = str(tmp_path / "one-process"), str(tmp_path / "two-processes")
    logs = [str(tmp_path / f"process-{i}.log") for i in (0, 1)]
    # The reference runs alongside: one process, 8 devices, the same (2, 2, 2) mesh.
    reference_env = base_env()
    reference_env["XLA_FLAGS"] += " --xla_force_host_platform_device_count=8"
    reference = start(job_args(reference_dir, small_corpus_dir), reference_env,
                      str(tmp_path / "reference.log"))
    args = job_args(workdir, small_corpus_dir)
    try:
        # 1. Both processes park after the checkpoint of step 2 and are SIGKILLed there.
        markers = tmp_path / "markers"
        markers.mkdir()
        procs = start_pair(args, logs, HOLD_AFTER_CHECKPOINT=(2, 2),
                           MARKER_DIR=(str(markers), str(markers)))
        deadline = time.time() + 300
        while len(os.listdir(markers)) < 2:
            assert all(p.poll() is None for p in procs), [read(log)[-3000:] for log in logs]
            assert time.time() < deadline, [read(log)[-3000:] for log in logs]
            time.sleep(0.2)
        for p in procs:
            p.send_signal(signal.SIGKILL)
        codes, outputs = finish(procs, logs)
        assert codes == [-signal.SIGKILL] * 2
        assert saved_steps(workdir) == [2]
        # Metrics, progress and the run record come from process 0 only.
        assert "model: tiny" in outputs[0] and "model: tiny" not in outputs[1]
        assert re.search(r"step 1/8", outputs[0]) and not re.search(r"step \d+/8", outputs[1])

        # 2. Resumed; only process 1 gets SIGTERM (after step 3): both stop at one agreed step,
        # checkpoint it together and exit 0, instead of process 0 waiting forever for the other.
        procs = start_pair(args, logs, SIGTERM_AFTER_STEP=(None, 3))
        codes, outputs = finish(procs, logs)
        assert codes == [0, 0], [out[-3000:] for out in outputs]
        assert "resuming from step 2" in outputs[0]
        stops = [re.findall(r"stopping after step (\d+)", out) for out in outputs]
        assert len(stops[0]) == 1 and stops[0] == stops[1], stops
        agreed = int(stops[0][0])
        assert 3 <= agreed < STEPS and saved_steps(workdir)[-1] == agreed

        # 3. To the end, started the way a person would: launch/local.sh with 2 processes.
        local_env = base_env()
        result = subprocess.run(
            ["bash", os.path.join(REPO, "launch", "local.sh"), "--processes=2", "--cpu-devices=4",
             f"--port={free_port()}", f"--python={sys.executable}", "--", *args],
            env=local_env, cwd=REPO, capture_output=True, text=True, timeout=300)
        assert result.returncode == 0, result.stderr[-3000:]
        assert f"resuming from step {agreed}" in result.stderr
        assert reference.wait(timeout=300) == 0, read(str(tmp_path / "reference.log"))[-3000:]
    finally:
        reference.kill()

    assert saved_steps(workdir)[-1] == STEPS
    got, want = logged(workdir), logged(reference_dir)
    assert [r["step"] for r in got] == [r["step"] for r in want]
    assert [r["step"] for r in got if "eval_mlm_loss" in r] == [4, 8]
    for a, b in zip(got, want):
        assert a.keys() == b.keys()
        for key in a:
            assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-7), (a["step"], key)
    params, reference_params = (flat(loading.load(d).params)
                                for d in (workdir, reference_dir))
    assert params.keys() == reference_params.keys()
    for name in params:
        np.testing.assert_allclose(params[name], reference_params[name], rtol=0, atol=1e-6,
                                   err_msg=name)


# The start-up settings, read without joining anything (jax.distributed.initialize is replaced,
# or refused because this process's JAX backend is already running).

@pytest.fixture
def clean_env(monkeypatch):
    for key in list(os.environ):
        if key.startswith(("JAX_COORDINATOR", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID",
                           "JAX_LOCAL_DEVICE_IDS", "SLURM_", "BERTJAX_PEER_TIMEOUT")):
            monkeypatch.delenv(key)
    return monkeypatch


def test_explicit_variables_are_read_and_checked(clean_env):
    assert distributed._explicit_settings() is None
    clean_env.setenv("JAX_COORDINATOR_ADDRESS", "10.0.0.1:1234")
    clean_env.setenv("JAX_NUM_PROCESSES", "4")
    clean_env.setenv("JAX_PROCESS_ID", "3")
    clean_env.setenv("JAX_LOCAL_DEVICE_IDS", "0,1")
    assert distributed._explicit_settings() == dict(
        coordinator_address="10.0.0.1:1234", num_processes=4, process_id=3,
        local_device_ids=[0, 1], cluster_detection_method="deactivate")
    for key, value, message in [
            ("JAX_COORDINATOR_ADDRESS", "10.0.0.1", "must be host:port"),
            ("JAX_COORDINATOR_ADDRESS", "host:99999", "must be host:port"),
            ("JAX_PROCESS_ID", "4", "JAX_PROCESS_ID=4 must be less than JAX_NUM_PROCESSES=4"),
            ("JAX_NUM_PROCESSES", "two", "JAX_NUM_PROCESSES='two' must be a positive whole"),
            ("JAX_LOCAL_DEVICE_IDS", "0;1", "comma-separated whole numbers")]:
        with clean_env.context() as env:
            env.setenv(key, value)
            with pytest.raises(UserError, match=message):
                distributed._explicit_settings()


def test_only_a_multi_task_srun_step_counts_as_a_slurm_job(clean_env):
    # The batch script itself has the job's task count but no step node list.
    clean_env.setenv("SLURM_NTASKS", "4")
    clean_env.setenv("SLURM_PROCID", "0")
    assert not distributed._inside_multi_task_slurm_step()
    clean_env.setenv("SLURM_STEP_NODELIST", "gpu[01-04]")
    clean_env.setenv("SLURM_STEP_NUM_TASKS", "4")
    assert distributed._inside_multi_task_slurm_step()
    clean_env.setenv("SLURM_STEP_NUM_TASKS", "1")
    assert not distributed._inside_multi_task_slurm_step()


def test_joining_after_the_backend_started_is_a_user_error(clean_env):
    import jax

    assert jax.devices()  # the backend is up (as after any earlier JAX work in this process)
    assert distributed.initialize_from_environment() is False  # nothing asks for it
    clean_env.setenv("JAX_COORDINATOR_ADDRESS", "127.0.0.1:1234")
    clean_env.setenv("JAX_NUM_PROCESSES", "2")
    clean_env.setenv("JAX_PROCESS_ID", "1")
    with pytest.raises(UserError, match="could not join the distributed job at 127.0.0.1:1234 "
                                        "as process 1 of 2: .*before any JAX"):
        distributed.initialize_from_environment()


def test_each_environment_starts_the_runtime_its_own_way(clean_env, capsys):
    calls = []
    clean_env.setattr("jax.distributed.initialize", lambda **kwargs: calls.append(kwargs))
    clean_env.setattr(distributed, "_on_cloud_tpu_vm", lambda: False)
    assert distributed.initialize_from_environment() is False and calls == []
    # Inside `srun` with 4 tasks: JAX reads SLURM's variables itself.
    for key, value in {"SLURM_STEP_NODELIST": "gpu[01-04]", "SLURM_STEP_NUM_TASKS": "4",
                       "SLURM_PROCID": "2"}.items():
        clean_env.setenv(key, value)
    timeouts = dict(heartbeat_timeout_seconds=120, shutdown_timeout_seconds=60)
    assert distributed.initialize_from_environment() is True and calls == [timeouts]
    # Explicit variables win, and JAX is told not to second-guess them from SLURM.
    clean_env.setenv("JAX_COORDINATOR_ADDRESS", "gpu01:1234")
    clean_env.setenv("JAX_NUM_PROCESSES", "4")
    clean_env.setenv("JAX_PROCESS_ID", "2")
    assert distributed.initialize_from_environment() is True
    assert calls[-1] == dict(coordinator_address="gpu01:1234", num_processes=4, process_id=2,
                             local_device_ids=None, cluster_detection_method="deactivate",
                             **timeouts)


def test_a_single_tpu_vm_without_metadata_runs_alone(clean_env, capsys):
    def unreachable(**kwargs):
        raise ConnectionError("metadata.google.internal: Name or service not known")

    clean_env.setattr("jax.distributed.initialize", unreachable)
    clean_env.setattr(distributed, "_on_cloud_tpu_vm", lambda: True)
    assert distributed.initialize_from_environment() is False
    assert capsys.readouterr().err == (
        "bertjax: warning: jax.distributed.initialize() failed on this TPU VM "
        "(metadata.google.internal: Name or service not known); running as one process\n")


def test_one_process_runs_process_zero_work_itself_and_needs_no_agreement(tmp_path):
    assert distributed.run_on_process_zero(lambda: 42, "answering") == 42
    with pytest.raises(UserError, match="bad corpus"):
        distributed.run_on_process_zero(lambda: (_ for _ in ()).throw(UserError("bad corpus")),
                                        "preparing")
    assert distributed.any_process(True) and not distributed.any_process(False)
    distributed.check_shared_directory(str(tmp_path), "workdir")  # trivially shared
    assert os.listdir(tmp_path) == []


# Each process runs the job three times in one interpreter, on: a workdir that is a different
# directory on each "host"; a shared workdir whose corpus process 0 fails to prepare; a shared
# workdir whose corpus process 0 prepares (the other waits, then opens it) and whose run record
# (kept by process 0) belongs to another model.
THREE_REFUSALS = textwrap.dedent("""
    import os, sys
    from bertjax.cli import main
    index, root, text, args = os.environ["JAX_PROCESS_ID"], sys.argv[1], sys.argv[2], sys.argv[3:]
    for workdir, source in ((f"{root}/host-{index}", text),
                            (f"{root}/shared", f"{root}/missing.txt"), (f"{root}/shared-2", text)):
        code = main.main(["bertjax.cli.main", *args, f"--workdir={workdir}",
                          f"--config.data.input={source}",
                          f"--config.data.prepared={workdir}/data"])
        print("exit", code, flush=True)
""")


def test_per_process_problems_stop_every_process_with_the_same_message(tmp_path,
                                                                         small_corpus_dir):
    text = os.path.join(os.path.dirname(small_corpus_dir), "wiki40.txt")
    (tmp_path / "shared-2").mkdir()
    (tmp_path / "shared-2" / "run.json").write_text('{"model": {"hidden_size": 1}}')
    port = free_port()
    procs = []
    for i in (0, 1):
        env = base_env(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=2,
                       JAX_PROCESS_ID=i)
        procs.append(subprocess.Popen(
            [sys.executable, "-c", THREE_REFUSALS, str(tmp_path), text,
             f"--config={REPO}/configs/tiny.py", "--config.data.vocab_size=1000"],
            env=env, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True))
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outputs
    for i, out in enumerate(outputs):
        lines = out.splitlines()
        assert [line for line in lines if line.startswith("exit")] == ["exit 2"] * 3, out
        errors = [line for line in lines if line.startswith("bertjax: error:")]
        assert errors[:2] == [
            f"bertjax: error: the workdir {tmp_path}/host-{i} is not shared by all 2 processes: "
            "with several hosts it must be on a file system every host mounts at the same path "
            "(NFS, a gcsfuse bucket, Filestore)",
            # Process 1 never prepares (it would report a missing corpus): this is process 0's.
            f"bertjax: error: input not found: {tmp_path}/missing.txt"], out
        assert errors[2].startswith(f"bertjax: error: workdir {tmp_path}/shared-2 holds a run "
                                    'with model={"hidden_size": 1}'), out
    assert os.path.exists(tmp_path / "shared-2" / "data" / "manifest.json")
