"""Bad input and bad configs: one clear line on stderr and exit status 2, never a traceback.

Library code raises `UserError` (a `ValueError`, so API callers can catch it as one); command-line
entry points wrap their body in `exit_on_user_error`, which turns it into the one-line report.
"""

from __future__ import annotations

import functools
import numbers
import sys
from typing import Callable, Collection, TypeVar

EXIT_BAD_INPUT = 2
# 128 + SIGTERM, as a shell reports a process the signal ended: a command stopped while writing
# an output (bertjax.core.output_dir) did not finish, and removed what it had written.
EXIT_TERMINATED = 143

_F = TypeVar("_F", bound=Callable[..., object])
_V = TypeVar("_V")


class UserError(ValueError):
    """A problem with the user's input, files or config, reported without a traceback."""

    # True when the line already says what a failed write left half-written, and where
    # (bertjax.core.storage_deadline.unfinished adds that account otherwise).
    says_what_is_left = False


def check_choice(setting: str, value: _V, choices: Collection, *, unknown: bool = False) -> _V:
    """`value`, if it is one of `choices`; else the UserError "masking.strategy must be one of
    token, span, got 'x'" or, with `unknown`, where `setting` names a kind of thing rather than
    a config key: "unknown input format 'x'; choose one of text, mediawiki"."""
    if value in choices:
        return value
    listed = ", ".join(str(choice) for choice in choices)
    if unknown:
        raise UserError(f"unknown {setting} {value!r}; choose one of {listed}")
    raise UserError(f"{setting} must be one of {listed}, got {value!r}")


def check_int(name: str, value, minimum: int, why: str = "") -> None:
    """Refuses anything but an integer (numpy's included, bool excluded) of at least `minimum`."""
    # numbers.Integral takes numpy's integers without importing numpy on the error path.
    if not isinstance(value, numbers.Integral) or isinstance(value, bool) or value < minimum:
        raise UserError(f"{name} must be an integer of at least {minimum}{' ' + why if why else ''}"
                        f", got {value!r}")


# Local copies of inputs named by URL (core/transfer.py), and those URLs: a refusal found by a
# reader of the copy names what the user gave, not the cache.
_COPIES: dict[str, str] = {}


def name_copy(local: str, original: str) -> None:
    _COPIES[local] = original


def report(message: str, program: str = "bertjax") -> None:
    # Keep it to one line so scripts can grep it.
    line = " ".join(str(message).split())
    for local in sorted(_COPIES, key=len, reverse=True):  # a copy inside another's: its own URL
        line = line.replace(local, _COPIES[local])
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
