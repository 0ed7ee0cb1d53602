"""What every command shares: its argument parser, its refusals and its quiet logs.

A command refuses bad input (a bad flag included) with one line on stderr, `bertjax: error: ...`,
and exit status 2 (`bertjax.core.errors`); it never prints argparse's usage dump or a traceback.
Its main is decorated with `command`, which also keeps the libraries' routine log chatter off
stderr (`bertjax.core.library_logs`) and JAX off accelerators that are not there
(`bertjax.core.platforms`); every storage call it makes is bounded as a whole
(`bertjax.core.storage_deadline`).
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
from typing import Callable, TypeVar

# Imported before the filter is attached: absl makes the "absl" logger an ABSLLogger, which
# records the caller (orbax) the filter looks for; attached earlier, the filter would create a
# plain logger that absl then keeps, and orbax's warnings would pass it as absl's own.
from absl import logging as absl_logging  # noqa: F401

from bertjax.core import packaged, storage, storage_deadline
from bertjax.core.errors import UserError, exit_on_user_error
from bertjax.core.library_logs import quiet_routine_library_logs
from bertjax.core.platforms import keep_off_absent_accelerators

_F = TypeVar("_F", bound=Callable[..., object])


class ArgumentParser(argparse.ArgumentParser):
    """argparse whose bad flags are a UserError: `command` reports it in one line, exit 2 (its
    subcommands' parsers are of this class too)."""

    def error(self, message: str):
        raise UserError(message)


def command(main: _F) -> _F:
    """Decorates a command's main: routine library logs quieted, a UserError one line on stderr
    and exit status 2 (a main that returns its status may catch UserError itself). JAX is kept
    off accelerators whose hardware is absent (`bertjax.core.platforms`), and every storage call
    is bounded as a whole (`bertjax.core.storage_deadline`; BERTJAX_STORAGE_TIMEOUT and
    BERTJAX_CACHE are checked before anything else)."""

    @functools.wraps(main)
    def run(*args, **kwargs):
        storage.timeout_seconds()  # the variables every command may use, checked first
        packaged.cache_dir()
        keep_off_absent_accelerators()
        quiet_routine_library_logs()
        with storage_deadline.enforced(storage.timeout_seconds):
            return main(*args, **kwargs)

    reported = exit_on_user_error(run)

    @functools.wraps(main)
    def ended(*args, **kwargs):
        # After a bucket stopped answering, the backends' worker threads may still be retrying
        # requests to it, and the interpreter's exit would wait for each: the command ends now.
        before = storage.unanswering()
        try:
            status = reported(*args, **kwargs)
        except SystemExit as e:
            if storage.unanswering() - before:
                _exit_now(e.code)
            raise
        if storage.unanswering() - before:
            _exit_now(status)
        return status

    return ended  # type: ignore[return-value]


def _exit_now(code) -> None:
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code if isinstance(code, int) else (0 if code is None else 1))
