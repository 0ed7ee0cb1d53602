"""One run per workdir: an exclusive lock on WORKDIR/.lock, held for as long as the run writes.

Two runs writing the same checkpoints and metrics would interleave them silently; the second one is
refused instead, naming the process that holds the workdir. The lock is `flock`, so the kernel
drops it the moment its holder dies (even by SIGKILL): a lock file left behind by a dead run holds
nothing and is simply taken over.

The file is never deleted. Unlinking it on release would let a waiting process lock the old
(unlinked) file while a third one creates and locks a new one, both believing they hold the
workdir. Its contents (host, pid, start time) only explain who holds it; the flock decides.

A multi-process run takes it on process 0 only: all its processes open the same shared workdir and
would refuse each other. Forked children (data workers) inherit the lock with the file descriptor,
so a run's lock lasts until they exit too.
"""

from __future__ import annotations

import datetime
import errno
import fcntl
import json
import os
import socket

from bertjax.core.errors import UserError

LOCK_FILE = ".lock"


class WorkdirLock:
    def __init__(self, workdir: str):
        self.workdir = workdir
        self.path = os.path.join(os.path.abspath(workdir), LOCK_FILE)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Takes the lock or raises UserError naming its holder. Never creates the workdir."""
        if self._fd is not None:
            return
        if not os.path.isdir(os.path.dirname(self.path)):
            raise UserError(f"cannot lock workdir {self.workdir}: it does not exist")
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        except OSError as e:
            raise UserError(f"cannot lock workdir {self.workdir}: {e.strerror}") from None
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as e:
            holder = _read_holder(fd)
            os.close(fd)
            if e.errno not in (errno.EWOULDBLOCK, errno.EAGAIN):
                raise UserError(f"cannot lock workdir {self.workdir}: {e.strerror}") from None
            raise UserError(f"workdir {self.workdir} is in use by {holder}; wait for it or use "
                            "another workdir") from None
        _write_holder(fd)
        self._fd = fd

    def release(self, *, quiet: bool = False) -> None:  # noqa: ARG002 (flock cannot fail)
        if self._fd is None:
            return
        fd, self._fd = self._fd, None
        try:
            os.ftruncate(fd, 0)  # no stale holder named once nobody holds it
        except OSError:
            pass
        os.close(fd)  # drops the flock

    def __enter__(self) -> "WorkdirLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def _write_holder(fd: int) -> None:
    holder = {"host": socket.gethostname(), "pid": os.getpid(),
              "since": datetime.datetime.now().astimezone().isoformat(timespec="seconds")}
    try:
        os.ftruncate(fd, 0)
        os.pwrite(fd, (json.dumps(holder) + "\n").encode(), 0)
    except OSError:
        pass  # the flock is what counts; the note only helps the next one explain it


def _read_holder(fd: int) -> str:
    try:
        holder = json.loads(os.pread(fd, 4096, 0).decode() or "{}")
        return (f"pid {int(holder['pid'])} on host {holder['host']} "
                f"(since {holder['since']})")
    except (OSError, ValueError, KeyError, TypeError):
        # The holder has not written its note yet, or an older bertjax wrote the file.
        return "another process"
