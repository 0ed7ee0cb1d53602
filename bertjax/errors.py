"""Bad input and bad configs: one clear line on stderr and exit status 2, never a traceback.

Library code raises `UserError` (a `ValueError`, so API callers can catch it as one); command-line
entry points wrap their body in `exit_on_user_error`, which turns it into the one-line report.
"""

from __future__ import annotations

import functools
import sys
from typing import Callable, TypeVar

EXIT_BAD_INPUT = 2

_F = TypeVar("_F", bound=Callable[..., object])


class UserError(ValueError):
    """A problem with the user's input, files or config, reported without a traceback."""


def report(message: str, program: str = "bertjax") -> None:
    # Keep it to one line so scripts can grep it.
    line = " ".join(str(message).split())
    print(f"{program}: error: {line}", file=sys.stderr, flush=True)


def exit_on_user_error(fn: _F) -> _F:
    """Decorates a CLI body: a UserError becomes one stderr line and exit status 2."""

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except UserError as e:
            report(str(e))
            sys.exit(EXIT_BAD_INPUT)

    return wrapper  # type: ignore[return-value]
