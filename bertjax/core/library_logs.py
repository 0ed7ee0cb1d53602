"""Routine chatter of the libraries underneath, kept off a CLI's stderr.

Orbax reports through absl logging at WARNING level what is expected when a command only reads a
checkpoint ("read_only=True, setting max_to_keep=None", "Given directory is read only"); a user
running `python -m bertjax.export` would take those lines for problems. The filter drops warnings
and lower from the named libraries; their errors, and everybody else's warnings, still show.
gcsfs's records, all of them, describe failures that reach the command as exceptions.
"""

from __future__ import annotations

import logging
import os

# Packages whose sub-ERROR log records are routine for a command-line user.
ROUTINE_SOURCES = ("orbax",)


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
