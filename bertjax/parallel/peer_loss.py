"""A multi-process job that loses one of its processes (a host preempted, killed or crashed): the
others leave within a stated bound, with one line on stderr, instead of waiting in a collective.

BERTJAX_PEER_TIMEOUT (whole seconds, default 60) bounds it. It is handed to
`jax.distributed.initialize` as the heartbeat timeout (a process that has sent no heartbeat for
that long is declared dead by the coordination service, which then ends every other process
itself, with JAX's own fatal lines and SIGABRT: the bound for a collective that hangs) and as the
shutdown timeout (how long a leaving process waits for the others at exit).

Where the collective fails at once instead (gloo between CPU processes: "Connection reset by
peer"; a coordination-service call answered with the peer's death), `leaving_on_loss` turns the
error into `PeerLost`: the run's own clean-up runs (on process 0: the logs pushed, the bucket lease
released), then the command prints its one line and exits with EXIT_PEER_LOST at once, skipping
JAX's exit barrier, which would wait for the dead process. A clean-up that itself hangs is cut
short after the same timeout. Restarting every process resumes from the last checkpoint. (When
the lost process is process 0, which hosts the coordination service, JAX's agent may print its
fatal lines too, racing this exit: it cannot be told otherwise from Python.)
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading

import jax

from bertjax.core.errors import UserError, report

PEER_TIMEOUT_VARIABLE = "BERTJAX_PEER_TIMEOUT"
DEFAULT_PEER_TIMEOUT_S = 60
# EX_TEMPFAIL (sysexits.h): not bad input (2) but a job to run again, which resumes.
EXIT_PEER_LOST = 75

# Words of the errors JAX raises in a process whose peer has gone: gloo's lost TCP pair, and the
# coordination service's verdicts.
_LOSS_MARKERS = ("gloo", "connection reset by peer", "connection closed by peer", "broken pipe",
                 "heartbeat timeout", "coordination service", "coordinationservice",
                 "tasks are unhealthy", "task is set to error")

_exiting = threading.Lock()


class PeerLost(UserError):
    """Another process of this job is gone; this one leaves (EXIT_PEER_LOST)."""


def peer_timeout_seconds() -> int:
    """BERTJAX_PEER_TIMEOUT, checked: a whole number of seconds of at least 1."""
    raw = os.environ.get(PEER_TIMEOUT_VARIABLE, "").strip()
    if not raw:
        return DEFAULT_PEER_TIMEOUT_S
    if not (raw.isascii() and raw.isdigit() and int(raw) >= 1):
        raise UserError(f"{PEER_TIMEOUT_VARIABLE}={raw!r} must be a whole number of seconds of "
                        "at least 1 (how long a multi-process job waits for a silent process)")
    return int(raw)


def initialize_timeouts() -> dict:
    """The keyword arguments of `jax.distributed.initialize` that bound a lost peer."""
    seconds = peer_timeout_seconds()
    return {"heartbeat_timeout_seconds": seconds, "shutdown_timeout_seconds": seconds}


def is_peer_loss(error: BaseException) -> bool:
    """True for the errors JAX raises when another process of the job has gone."""
    if isinstance(error, UserError):
        return False
    text = str(error).lower()
    return any(marker in text for marker in _LOSS_MARKERS)


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0][:300] if text else type(error).__name__


@contextlib.contextmanager
def leaving_on_loss():
    """In a job of several processes: a lost peer's error raised as PeerLost, with a watchdog
    that ends this process (one line, EXIT_PEER_LOST) should the clean-up the error unwinds
    through (outside this block) wait on the dead process longer than BERTJAX_PEER_TIMEOUT."""
    process_count = jax.process_count()
    if process_count <= 1:
        yield
        return
    try:
        yield
    except Exception as e:
        if not is_peer_loss(e):
            raise
        lost = PeerLost(f"lost contact with another process of this {process_count}-process job "
                        f"({_first_line(e)}); start the job again on every host: it resumes "
                        "from the last checkpoint")
        watchdog = threading.Timer(peer_timeout_seconds(), leave, args=(str(lost),))
        watchdog.daemon = True
        watchdog.start()
        raise lost from None


def leave(message: str) -> None:
    """Reports `message` (once, whichever thread comes first) and ends the process now: the
    interpreter's exit would wait at JAX's shutdown barrier for the process that is gone."""
    if not _exiting.acquire(blocking=False):
        return
    sys.stdout.flush()
    report(message)
    sys.stderr.flush()
    os._exit(EXIT_PEER_LOST)
