"""Routine chatter of the libraries underneath, kept off a CLI's stderr.

Orbax reports through absl logging at WARNING level what is expected when a command only reads a
checkpoint ("read_only=True, setting max_to_keep=None", "Given directory is read only"); a user
running `python -m bertjax.export` would take those lines for problems. The filter drops warnings
and lower from the named libraries; their errors, and everybody else's warnings, still show.
gcsfs's records, all of them, describe failures that reach the command as exceptions.

A failed checkpoint read (a truncated chunk on a bucket) also leaves Orbax's and TensorStore's
other reads behind, and they print tracebacks after the command has reported its one line: see
quiet_orbax_leftovers.
"""

from __future__ import annotations

import logging
import os
import sys

# Packages whose sub-ERROR log records are routine for a command-line user.
ROUTINE_SOURCES = ("orbax",)
_ORBAX_DIR = os.sep + "orbax" + os.sep


class _DropRoutineRecords(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno >= logging.ERROR:
            return True
        parts = os.path.normpath(record.pathname).split(os.sep)
        return not any(source in parts for source in ROUTINE_SOURCES)


_FILTER = _DropRoutineRecords()
# gcsfs logs each failed request with its traceback before retrying it or raising it to us: the
# raised error (or the storage deadline) is reported in one line, so the log copies are noise.
_FAILURE_LOGGERS = ("gcsfs",)


class _DropAll(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return False


_DROP_ALL = _DropAll()


def quiet_routine_library_logs() -> None:
    """Installs the filter on absl's logger (idempotent); call it at a CLI's entry point."""
    logger = logging.getLogger("absl")
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
    for name in _FAILURE_LOGGERS:
        logger = logging.getLogger(name)
        if _DROP_ALL not in logger.filters:
            logger.addFilter(_DROP_ALL)
    quiet_orbax_leftovers()


_leftovers_quieted = False


def quiet_orbax_leftovers() -> None:
    """Installs (once) hooks that drop what a failed restore leaves behind: un-awaited coroutines
    of Orbax ("Exception ignored in: <coroutine ...>"), and TensorStore completions that call
    back into the restore's event loop after it closed ("Event loop is closed", from a native
    thread: its traceback starts in asyncio). The failure itself reaches the caller as an
    exception and is reported once."""
    global _leftovers_quieted
    if _leftovers_quieted:
        return
    _leftovers_quieted = True
    unraisable, excepthook = sys.unraisablehook, sys.excepthook

    def unraisable_hook(record):
        if not (_late_callback(record.exc_value) or _raised_in_orbax(record.exc_traceback)):
            unraisable(record)

    def except_hook(kind, value, traceback):
        if not (_late_callback(value) and _starts_in_asyncio(traceback)):
            excepthook(kind, value, traceback)

    sys.unraisablehook, sys.excepthook = unraisable_hook, except_hook


def _late_callback(error) -> bool:
    return isinstance(error, RuntimeError) and str(error) == "Event loop is closed"


def _starts_in_asyncio(traceback) -> bool:
    """Called from native code: no Python frame before asyncio's own."""
    return traceback is not None and \
        f"{os.sep}asyncio{os.sep}" in traceback.tb_frame.f_code.co_filename


def _raised_in_orbax(traceback) -> bool:
    while traceback is not None:
        if _ORBAX_DIR in traceback.tb_frame.f_code.co_filename:
            return True
        traceback = traceback.tb_next
    return False
