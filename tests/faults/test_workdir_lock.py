"""One run per workdir: a second process is refused by name, a dead holder's lock is taken over."""

import os
import signal
import socket
import subprocess
import sys

import pytest

from bertjax.core.errors import UserError
from bertjax.train.workdir_lock import LOCK_FILE, WorkdirLock

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

# Takes the lock, says so, and holds it until its stdin closes.
HOLDER = """
import sys
from bertjax.train.workdir_lock import WorkdirLock
with WorkdirLock(sys.argv[1]):
    print("held", flush=True)
    sys.stdin.read()
"""


def start_holder(workdir):
    env = {**os.environ, "PYTHONPATH": REPO}
    holder = subprocess.Popen([sys.executable, "-c", HOLDER, workdir], stdin=subprocess.PIPE,
                              stdout=subprocess.PIPE, text=True, env=env)
    assert holder.stdout.readline().strip() == "held"
    return holder


def read_lock(workdir):
    with open(os.path.join(workdir, LOCK_FILE)) as f:
        return f.read()


def test_second_process_is_refused_naming_the_holder(tmp_path):
    workdir = str(tmp_path)
    holder = start_holder(workdir)
    try:
        with pytest.raises(UserError) as refused:
            WorkdirLock(workdir).acquire()
        message = str(refused.value)
        assert message.startswith(f"workdir {workdir} is in use by pid {holder.pid} on host "
                                  f"{socket.gethostname()} (since ")
        assert message.endswith("); wait for it or use another workdir")
        assert "\n" not in message
    finally:
        holder.stdin.close()
        assert holder.wait(timeout=30) == 0
    # Released on exit: the next run takes it and names itself; the file is never deleted.
    with WorkdirLock(workdir) as lock:
        assert lock.held
        assert f'"pid": {os.getpid()}' in read_lock(workdir)
    assert not lock.held
    assert os.path.exists(os.path.join(workdir, LOCK_FILE))


def test_lock_of_a_killed_run_is_taken_over(tmp_path):
    workdir = str(tmp_path)
    holder = start_holder(workdir)
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=30)
    holder.stdin.close()
    assert f'"pid": {holder.pid}' in read_lock(workdir)  # the stale note is still there
    lock = WorkdirLock(workdir)
    lock.acquire()
    try:
        assert f'"pid": {os.getpid()}' in read_lock(workdir)
    finally:
        lock.release()


def test_held_lock_refuses_a_second_holder_in_the_same_process(tmp_path):
    with WorkdirLock(str(tmp_path)):
        with pytest.raises(UserError, match=f"in use by pid {os.getpid()} "):
            WorkdirLock(str(tmp_path)).acquire()
    with WorkdirLock(str(tmp_path)):
        pass


def test_missing_workdir_is_not_created(tmp_path):
    workdir = str(tmp_path / "not-yet")
    with pytest.raises(UserError, match="does not exist"):
        WorkdirLock(workdir).acquire()
    assert not os.path.exists(workdir)
