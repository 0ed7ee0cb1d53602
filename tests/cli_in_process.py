"""A command-line entry point run inside the test process as `python -m` runs it: its exit status,
and everything it writes to stdout and stderr (at the file descriptors, so that what libraries
write below Python is caught too).

Starting an interpreter and importing JAX costs seconds; most tests of a command are about our
code, not the process, and run here. What the process leaves changed is put back: sys.argv, the
working directory, the environment, logging (absl's verbosity, every logger's level, filters and
handlers), signal handlers and warning filters. Python's warnings are shown on stderr as in a
fresh interpreter (pytest would otherwise record them silently).
"""

from __future__ import annotations

import contextlib
import importlib
import logging
import os
import signal
import subprocess
import sys
import tempfile
import traceback
import warnings

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# The documented `python -m bertjax.X` names run these modules (see the shims' runpy calls).
COMMANDS = {"main": "bertjax.cli.main", "data.prepare": "bertjax.cli.prepare",
            "data.inspect": "bertjax.cli.inspect", "export": "bertjax.cli.export",
            "convert": "bertjax.cli.convert", "bench": "bertjax.cli.bench",
            "embed": "bertjax.cli.embed", "evaluate": "bertjax.cli.evaluate",
            "index": "bertjax.cli.index", "wsd": "bertjax.cli.wsd"}
SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP, signal.SIGUSR1)


def exit_status(code) -> int:
    """What the interpreter exits with for sys.exit(code) (a string is printed, status 1)."""
    if code is None:
        return 0
    if isinstance(code, int):
        return code
    print(code, file=sys.stderr)
    return 1


@contextlib.contextmanager
def _logging_kept():
    from absl import logging as absl_logging

    verbosity = absl_logging.get_verbosity()
    loggers = [logging.getLogger()] + [logging.getLogger(name) for name in
                                       list(logging.root.manager.loggerDict)]
    saved = [(lg, lg.level, list(lg.filters), list(getattr(lg, "handlers", [])),
              getattr(lg, "disabled", False), getattr(lg, "propagate", True)) for lg in loggers]
    try:
        yield
    finally:
        absl_logging.set_verbosity(verbosity)
        for lg, level, filters, handlers, disabled, propagate in saved:
            # Each setLevel clears the cache of every logger the process has, so it is called
            # only where the level changed (otherwise a cost that adds up over the suite).
            if lg.level != level:
                lg.setLevel(level)
            lg.filters[:] = filters
            lg.handlers[:] = handlers
            lg.disabled, lg.propagate = disabled, propagate


@contextlib.contextmanager
def _process_state_kept():
    argv, cwd, environ = list(sys.argv), os.getcwd(), dict(os.environ)
    handlers = {s: signal.getsignal(s) for s in SIGNALS}
    try:
        with _logging_kept(), warnings.catch_warnings():
            # A fresh interpreter's filters, shown on stderr.
            warnings.resetwarnings()
            for category in (DeprecationWarning, PendingDeprecationWarning, ImportWarning,
                             ResourceWarning):
                warnings.simplefilter("ignore", category)
            # As in a child process (conftest's PYTHONWARNINGS): the suite's shared cache, not ours.
            warnings.filterwarnings("ignore", message="Error reading persistent compilation cache")
            warnings.showwarning = lambda message, category, filename, lineno, file=None, \
                line=None: sys.stderr.write(warnings.formatwarning(message, category, filename,
                                                                   lineno, line))
            yield
    finally:
        sys.argv[:] = argv
        os.chdir(cwd)
        if dict(os.environ) != environ:
            os.environ.clear()
            os.environ.update(environ)
        for s, handler in handlers.items():
            if handler is not None:
                signal.signal(s, handler)


@contextlib.contextmanager
def _output_to(out_path: str, err_path: str):
    """fds 1 and 2, and sys.stdout and sys.stderr, appended to the two files."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved_fds = os.dup(1), os.dup(2)
    saved_streams = sys.stdout, sys.stderr
    opened = [open(path, "a", buffering=1, encoding="utf-8", errors="replace")
              for path in (out_path, err_path)]
    try:
        os.dup2(opened[0].fileno(), 1)
        os.dup2(opened[1].fileno(), 2)
        sys.stdout, sys.stderr = opened
        yield
    finally:
        for stream in opened:
            stream.flush()
        sys.stdout, sys.stderr = saved_streams
        os.dup2(saved_fds[0], 1)
        os.dup2(saved_fds[1], 2)
        for fd in saved_fds:
            os.close(fd)
        for stream in opened:
            stream.close()


def run(name: str, *args: str) -> subprocess.CompletedProcess:
    """`python -m bertjax.NAME ARGS` (NAME as documented, or a bertjax.cli module), run here, from
    the repository root; a traceback goes to stderr with status 1, as the interpreter does."""
    shown = name if name.startswith("bertjax.") else f"bertjax.{name}"
    module = COMMANDS.get(name, shown)
    command = importlib.import_module(module)
    with tempfile.TemporaryDirectory() as tmp:
        out, err = os.path.join(tmp, "stdout"), os.path.join(tmp, "stderr")
        with _process_state_kept(), _output_to(out, err):
            os.chdir(REPO)
            sys.argv[:] = [command.__file__, *args]
            try:
                # As the module's `if __name__ == "__main__"` block does: main() reads sys.argv.
                status = exit_status(command.main())
            except SystemExit as e:
                status = exit_status(e.code)
            except Exception:  # noqa: BLE001 (what an uncaught exception does to a process)
                traceback.print_exc()
                status = 1
        with open(out, encoding="utf-8") as f_out, open(err, encoding="utf-8") as f_err:
            stdout, stderr = f_out.read(), f_err.read()
    return subprocess.CompletedProcess(["python", "-m", shown, *args], status, stdout, stderr)
