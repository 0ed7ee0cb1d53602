"""A multi-process job that loses one of its processes (a host preempted, killed or crashed): the
others leave within a stated bound, with one line on stderr, instead of waiting in a collective.

BERTJAX_PEER_TIMEOUT (whole seconds, default 60) bounds it, two ways:

- Where the collective fails at once (gloo between CPU processes: "Connection reset by peer"; a
  coordination-service call answered with the peer's death), `leaving_on_loss` turns the error
  into `PeerLost`: the run's own clean-up runs (on process 0: the logs pushed, the bucket lease
  released), then the command prints its one line and exits with EXIT_PEER_LOST at once, skipping
  JAX's exit barrier, which would wait for the dead process. A clean-up that itself hangs is cut
  short after BERTJAX_PEER_TIMEOUT.
- Where it hangs (a host that stops answering), `PeerWatch` notices: every process bumps its own
  key in the coordination service's key-value store every second and reads the others'; a peer
  whose key has not changed for BERTJAX_PEER_TIMEOUT seconds (on this process's own clock) is
  lost, and this process leaves the same way, without clean-up. JAX's heartbeat timeout is set to
  twice that: its own verdict (fatal lines, SIGABRT) is the backstop, should the store itself not
  answer.

When the lost process is process 0, which hosts the coordination service, JAX's agent may print
its fatal lines too, racing this exit: that cannot be told otherwise from Python. Restarting every
process resumes from the last checkpoint.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time

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
    """The keyword arguments of `jax.distributed.initialize` that bound a lost peer: JAX's own
    verdict after PeerWatch's, as its backstop."""
    seconds = peer_timeout_seconds()
    return {"heartbeat_timeout_seconds": 2 * seconds, "shutdown_timeout_seconds": seconds}


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


_ALIVE = "bertjax/alive/"  # + the process index: its beat count, or DONE
_DONE = "done"
_BEAT_S = 1.0


class PeerWatch:
    """Leaves (one line, EXIT_PEER_LOST) once another process of the job has not beaten for
    `timeout_s` seconds; a process that ended its command normally says so (`finish`) and is
    not waited for."""

    def __init__(self, client, index: int, count: int, timeout_s: float):
        self.client, self.index, self.count, self.timeout_s = client, index, count, timeout_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True, name="bertjax-peer-watch")

    def start(self) -> "PeerWatch":
        self._thread.start()
        return self

    def finish(self) -> None:
        self._stop.set()
        try:
            self.client.key_value_set(f"{_ALIVE}{self.index}", _DONE, allow_overwrite=True)
        except Exception:  # the service is gone: nobody is left to wait for this process
            pass

    def _run(self) -> None:
        started = time.monotonic()
        seen: dict[str, tuple[str, float]] = {}  # key -> (its value, when it last changed)
        beats = 0
        while not self._stop.wait(_BEAT_S):
            beats += 1
            try:
                self.client.key_value_set(f"{_ALIVE}{self.index}", str(beats),
                                          allow_overwrite=True)
                values = dict(self.client.key_value_dir_get(_ALIVE))
            except Exception as e:
                if self._stop.is_set():
                    return
                leave(f"lost contact with the coordination service of this {self.count}-"
                      f"process job, held by process 0 ({_first_line(e)}); start the job again "
                      "on every host: it resumes from the last checkpoint")
                return
            now = time.monotonic()
            for peer in range(self.count):
                key = f"{_ALIVE}{peer}"
                value = values.get(key)
                if peer == self.index or value == _DONE:
                    continue
                if key not in seen or seen[key][0] != value:
                    seen[key] = (value, now if value is not None else started)
                if now - seen[key][1] > self.timeout_s and not self._stop.is_set():
                    leave(f"lost contact with process {peer} of this {self.count}-process job "
                          f"(silent for {self.timeout_s:g}s, BERTJAX_PEER_TIMEOUT); start the "
                          "job again on every host: it resumes from the last checkpoint")
                    return


_watch: PeerWatch | None = None


def watch(client) -> None:
    """Starts this process's PeerWatch (once jax.distributed is up; `client` is JAX's)."""
    global _watch
    if client is None or _watch is not None or jax.process_count() <= 1:
        return
    _watch = PeerWatch(client, jax.process_index(), jax.process_count(),
                       peer_timeout_seconds()).start()


def finish() -> None:
    """This process ends its command normally: the others need not wait for it."""
    if _watch is not None:
        _watch.finish()
