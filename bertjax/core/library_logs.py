"""Routine chatter of the libraries underneath, kept off a CLI's stderr.

Orbax reports through absl logging at WARNING level what is expected when a command only reads a
checkpoint ("read_only=True, setting max_to_keep=None", "Given directory is read only"); a user
running `python -m bertjax.export` would take those lines for problems. The filter drops warnings
and lower from the named libraries; their errors, and everybody else's warnings, still show.
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


def quiet_routine_library_logs() -> None:
    """Installs the filter on absl's logger (idempotent); call it at a CLI's entry point."""
    logger = logging.getLogger("absl")
    if _FILTER not in logger.filters:
        logger.addFilter(_FILTER)
