"""SIGTERM while an output is being written: the process ends with EXIT_TERMINATED and one line
saying what it removed or left (the default action would end it silently, leaving the output
half-written).

Two ways, for two kinds of work. `ended_by_sigterm` does the clean-up in the handler itself,
for work bertjax does not control step by step (a model computing, Orbax writing): an exception
raised from a handler can land in a callback (a gc hook of jax's) that swallows it.
`deferred_sigterm` only records the signal, for a loop that checks it between steps: an upload
stops between two objects, never with a request in flight that could still land after its
object was removed. Only the main thread may set a handler; elsewhere the default stays.
"""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading
from typing import Callable, Iterator

from bertjax.core.errors import EXIT_TERMINATED


def end(line: str) -> None:
    """One stderr line, then the process ends at once (no finally blocks, no atexit)."""
    print(f"bertjax: {' '.join(line.split())}", file=sys.stderr, flush=True)
    os._exit(EXIT_TERMINATED)


@contextlib.contextmanager
def ended_by_sigterm(clean_up: Callable[[], str]) -> Iterator[None]:
    """While the block runs, SIGTERM calls `clean_up` (which returns the line to print) and ends
    the process."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: end(clean_up()))
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, previous)


class Pending:
    """Whether SIGTERM arrived since the block began (`deferred_sigterm`)."""

    def __init__(self) -> None:
        self.arrived = False


@contextlib.contextmanager
def deferred_sigterm() -> Iterator[Pending]:
    """While the block runs, SIGTERM only sets `.arrived` on what is yielded: the block checks it
    between its steps and ends the process itself (`end`)."""
    pending = Pending()
    if threading.current_thread() is not threading.main_thread():
        yield pending
        return

    def record(signum, frame):
        pending.arrived = True

    previous = signal.signal(signal.SIGTERM, record)
    try:
        yield pending
    finally:
        signal.signal(signal.SIGTERM, previous)
