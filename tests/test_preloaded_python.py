"""tests/preloaded_python.py: a child forked from the preloaded server answers as the same command
started afresh does (output, errors, exit status, signals, environment, working directory), and
creates its own JAX backend from its own XLA_FLAGS."""

import os
import signal
import subprocess
import sys
import time

import pytest

import preloaded_python
from pretrain_runs import REPO, child_env

SCRIPT = """
import os, sys
print("argv", sys.argv[1:], "cwd", os.getcwd(), "only mine", os.environ.get("ONLY_MINE"))
with open("/proc/self/cmdline", "rb") as f:
    server = "preloaded" + "_server.py"  # not itself on a fresh interpreter's command line
    print("forked" if server.encode() in f.read() else "started")
print("read", sys.stdin.read().upper(), file=sys.stderr)
if sys.argv[1] == "raise":
    raise ValueError("from the child")
sys.exit(int(sys.argv[1]))
"""


def both(args, **kwargs):
    """(forked, started afresh) results of one command."""
    return (preloaded_python.run(args, **kwargs), subprocess.run(args, **kwargs))


@pytest.mark.parametrize("ending", ["0", "3", "raise"])
def test_a_forked_child_answers_as_a_fresh_interpreter(tmp_path, monkeypatch, ending):
    monkeypatch.setattr(preloaded_python, "RUN_TIME_VARIABLES",
                        preloaded_python.RUN_TIME_VARIABLES + ("ONLY_MINE",))
    forked, fresh = both([sys.executable, "-c", SCRIPT, ending, "b c"], cwd=str(tmp_path),
                         env=child_env(ONLY_MINE="yes"), input="in\n", capture_output=True,
                         text=True, timeout=120)
    (said, how), (said_fresh, how_fresh) = (r.stdout.splitlines() for r in (forked, fresh))
    assert (how, how_fresh) == ("forked", "started")
    assert (forked.returncode, said, forked.stderr) == (fresh.returncode, said_fresh, fresh.stderr)
    assert f"cwd {tmp_path} only mine yes" in said and "read IN" in forked.stderr


def test_a_refused_command_says_one_line_as_it_does_started_afresh(tmp_path):
    args = [sys.executable, "-m", "bertjax.main", "--config=configs/nope.py",
            f"--workdir={tmp_path}/wd"]
    forked, fresh = both(args, cwd=REPO, env=child_env(), capture_output=True, text=True,
                         timeout=120)
    assert forked.returncode == fresh.returncode == 2
    assert forked.stderr == fresh.stderr and len(forked.stderr.splitlines()) == 1, forked.stderr


def test_each_child_builds_its_backend_from_its_own_xla_flags():
    code = "import jax; print(jax.device_count())"
    counts = [preloaded_python.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
        env=child_env(XLA_FLAGS=f"--xla_force_host_platform_device_count={n}")).stdout.strip()
        for n in (3, 5)]
    assert counts == ["3", "5"]


def test_a_child_is_its_own_process_for_signals_and_timeouts():
    child = preloaded_python.popen([sys.executable, "-c", "import time\nprint('up', flush=True)\n"
                                    "time.sleep(600)"], env=child_env(), stdout=subprocess.PIPE,
                                   stderr=subprocess.PIPE, text=True)
    assert isinstance(child, preloaded_python.PreloadedProcess)
    assert child.stdout.readline() == "up\n" and child.poll() is None
    with open(f"/proc/{child.pid}/cmdline", "rb") as f:
        assert b"preloaded_server.py" in f.read()  # the server's image, a process of its own
    with pytest.raises(subprocess.TimeoutExpired):
        child.wait(timeout=0.2)
    child.send_signal(signal.SIGTERM)
    assert child.communicate(timeout=60) == ("", "") and child.returncode == -signal.SIGTERM
    started = time.monotonic()
    with pytest.raises(subprocess.TimeoutExpired):
        preloaded_python.run([sys.executable, "-c", "import time; time.sleep(600)"],
                             env=child_env(), timeout=1)
    assert time.monotonic() - started < 60


def test_an_environment_read_while_importing_gets_a_server_of_its_own(monkeypatch):
    monkeypatch.setattr(preloaded_python, "_servers", {})
    code = "import jax; print(jax.config.jax_default_matmul_precision)"
    for precision in ("highest", "bfloat16"):
        done = preloaded_python.run([sys.executable, "-c", code], capture_output=True, text=True,
                                    env=child_env(JAX_DEFAULT_MATMUL_PRECISION=precision),
                                    timeout=120)
        assert done.stdout.strip() == precision, done.stderr
    assert len(preloaded_python._servers) == 2
    for server in preloaded_python._servers.values():
        server.close()


# A config file is code `python -m bertjax.main` runs: this one says whether its process was
# forked from the server (the server's command line) or started, then ends the process as asked.
PROBE_CONFIG = """
import os, signal, sys
def get_config():
    with open("/proc/self/cmdline", "rb") as f:
        print("forked" if b"preloaded_server.py" in f.read() else "started", flush=True)
    if os.environ.get("PROBE_END") == "kill":
        os.kill(os.getpid(), signal.SIGKILL)
    sys.exit(int(os.environ.get("PROBE_END", "0")))
"""

FORWARDING_SCRIPT = """
import os, subprocess, sys
probe, workdir = sys.argv[1:]
for end in ("0", "4", "kill"):
    command = subprocess.run([sys.executable, "-m", "bertjax.main", f"--config={probe}",
                              f"--workdir={workdir}"], env=dict(os.environ, PROBE_END=end),
                             capture_output=True, text=True)
    print(command.returncode, command.stdout.strip())
other = subprocess.run([sys.executable, "-c", "import sys; print(sys.executable)"],
                       capture_output=True, text=True)
print(other.stdout.strip())
sys.exit(5)
"""


def test_a_forked_scripts_bertjax_commands_are_forked_and_answer_as_processes(tmp_path):
    (tmp_path / "probe.py").write_text(PROBE_CONFIG)
    (tmp_path / "script.py").write_text(FORWARDING_SCRIPT)
    done = preloaded_python.run_script(
        str(tmp_path / "script.py"), str(tmp_path / "probe.py"), str(tmp_path / "wd"),
        cwd=REPO, env=child_env(), capture_output=True, text=True, timeout=120)
    assert done.returncode == 5, done.stderr
    # Each command forked, its exit status or signal the script's child's; anything else started
    # by the real interpreter, which the script's sys.executable is not.
    assert done.stdout.splitlines() == ["0 forked", "4 forked", f"{-signal.SIGKILL} forked",
                                        sys.executable], done.stderr
