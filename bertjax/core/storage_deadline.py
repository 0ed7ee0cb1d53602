"""A bound on every storage call of a command, retries included.

gcsfs bounds each HTTP request by BERTJAX_STORAGE_TIMEOUT but retries a failed one up to six
times with a backoff (half a minute on top of six timeouts), and logs each failure; TensorStore
(Orbax's checkpoint arrays) retries a refused connection up to 32 times, over minutes. A
storage server that stops answering, or is gone, would hold a command for minutes and flood
its stderr. So a command (bertjax.cli.entry) also bounds each storage call as a whole:

    with storage_deadline.bounded(url, "write"):           # our own requests (core/storage.py)
        ...
        storage_deadline.progress(nbytes)                  # a long transfer that still moves

A call gets BERTJAX_STORAGE_TIMEOUT seconds, plus one second per MIN_THROUGHPUT bytes it moves
(a multi-gigabyte checkpoint is not cut short); `progress` restarts the clock. A call still
running past its deadline ends the command at once: one line on stderr naming the URL, what was
being done and what it leaves unfinished (the notes of `unfinished`), exit status 2, after the
local clean-ups registered with the notes. No later request is made: each would wait out the
timeout too.

In a Python process that is not a command (bertjax.load in a notebook) nothing is ever ended:
`bounded` records nothing there, and the per-request bound with the backend's retries applies.
"""

from __future__ import annotations

import contextlib
import dataclasses
import itertools
import os
import sys
import threading
import time
from typing import Callable, Iterator

from bertjax.core.errors import EXIT_BAD_INPUT, UserError

# What a transfer is allowed at least, in bytes per second, on top of the timeout: far below
# any real link to a bucket, so it bounds a server that has stopped, never one that is slow.
MIN_THROUGHPUT = 2 * 1024 * 1024
_POLL_S = 0.1


@dataclasses.dataclass
class _Call:
    url: str
    doing: str
    deadline: float
    finished: Callable[[], bool] | None = None  # a call that runs in the background


@dataclasses.dataclass
class _Unfinished:
    note: str
    clean_up: Callable[[], None] | None
    pending: Callable[[], bool] | None  # a background write's note holds only while it runs


_lock = threading.Lock()
_calls: dict[int, _Call] = {}
_unfinished: dict[int, _Unfinished] = {}
_tokens = itertools.count()
_local = threading.local()  # the calls the current thread is inside, innermost last
_enforcing = 0  # how many commands of this process enforce deadlines (nested in tests)
_watchdog: threading.Thread | None = None
_timeout_s: Callable[[], float] = lambda: 30.0
# How a bucket that stopped answering is reported, whichever way it was noticed.
NO_ANSWER = "the storage server did not answer within {:g}s (BERTJAX_STORAGE_TIMEOUT)"


@contextlib.contextmanager
def enforced(timeout_s: Callable[[], float]) -> Iterator[None]:
    """Deadlines end the process while the block runs (a command's main)."""
    global _enforcing, _watchdog, _timeout_s
    with _lock:
        _enforcing += 1
        _timeout_s = timeout_s
        if _watchdog is None:
            _watchdog = threading.Thread(target=_watch, name="bertjax-storage-deadline",
                                         daemon=True)
            _watchdog.start()
    try:
        yield
    finally:
        with _lock:
            _enforcing -= 1


def begin(url: str, doing: str, nbytes: int = 0,
          finished: Callable[[], bool] | None = None) -> int | None:
    """Starts the clock on a call; returns its token for `end` (None where nothing is enforced).
    A call made in the background passes `finished`, asked by the watchdog."""
    if not _enforcing:
        return None
    with _lock:
        token = next(_tokens)
        _calls[token] = _Call(url, doing, _deadline(nbytes), finished)
    return token


def end(token: int | None) -> None:
    if token is not None:
        with _lock:
            _calls.pop(token, None)


@contextlib.contextmanager
def bounded(url: str, doing: str, nbytes: int = 0) -> Iterator[None]:
    token = begin(url, doing, nbytes)
    stack = _local.__dict__.setdefault("tokens", [])
    stack.append(token)
    try:
        yield
    finally:
        stack.pop()
        end(token)


def progress(nbytes: int = 0) -> None:
    """The current thread's calls moved on (one more file of a tree): their clocks restart,
    with time for `nbytes` more."""
    tokens = getattr(_local, "tokens", [])
    with _lock:
        for token in tokens:
            if token in _calls:
                _calls[token].deadline = _deadline(nbytes)


def note(text: str, clean_up: Callable[[], None] | None = None,
         pending: Callable[[], bool] | None = None) -> int:
    """Until `drop(token)` (and while `pending()` says so), an ended command says `text` (what is
    left half-written, and where) after its reason, and runs `clean_up` first (local files
    only: no request)."""
    with _lock:
        token = next(_tokens)
        _unfinished[token] = _Unfinished(text, clean_up, pending)
    return token


def drop(token: int) -> None:
    with _lock:
        _unfinished.pop(token, None)


@contextlib.contextmanager
def unfinished(text: str, clean_up: Callable[[], None] | None = None) -> Iterator[None]:
    """`note` for the duration of the block; a UserError raised from it (a request that failed
    before the deadline) says the same after its own words."""
    token = note(text, clean_up)
    try:
        yield
    except UserError as e:
        if e.says_what_is_left:
            raise
        raise UserError(f"{e}; {text}") from None
    finally:
        drop(token)


def _deadline(nbytes: int) -> float:
    return time.monotonic() + _timeout_s() + nbytes / MIN_THROUGHPUT


def _watch() -> None:
    while True:
        time.sleep(_POLL_S)
        with _lock:
            if not _enforcing:
                continue
            now = time.monotonic()
            overdue = [c for c in _calls.values() if c.deadline < now]
        for call in overdue:
            if call.finished is None or not _finished(call):
                _end_command(call)


def _finished(call: _Call) -> bool:
    return not _holds(lambda: not call.finished())


def _holds(question: Callable[[], bool]) -> bool:
    try:
        return bool(question())
    except Exception:  # a background call that failed: whoever waits for it reports that
        return False


def _end_command(call: _Call) -> None:
    with _lock:
        notes = [item for item in _unfinished.values()
                 if item.pending is None or _holds(item.pending)]
    for item in notes:
        if item.clean_up is not None:
            with contextlib.suppress(Exception):
                item.clean_up()
    line = f"cannot {call.doing} {call.url}: {NO_ANSWER.format(_timeout_s())}"
    line = "; ".join([line] + list(dict.fromkeys(item.note for item in notes)))
    with contextlib.suppress(Exception):
        sys.stdout.flush()
    os.write(2, f"bertjax: error: {' '.join(line.split())}\n".encode())
    os._exit(EXIT_BAD_INPUT)
