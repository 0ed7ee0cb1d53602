"""Every command-line entry point, one module each, over one shared plumbing (`entry`). The
documented `python -m bertjax.X` modules are thin shims that run a module of this package.

A process started as a bertjax command (`python -m bertjax.X`) re-executes itself here, once,
with glibc's huge-page tunable (`bertjax.core.host_memory`): glibc reads tunables only when a
process starts, so it must happen before any command module imports JAX, and every command module
is imported after this package. Such a process also imports with Python's garbage collector held
off until its main begins (`bertjax.core.startup_collection`). A program or a test that imports a
command is left as it is.
"""

from __future__ import annotations

import sys

from bertjax.core import host_memory, startup_collection

# Python's options that take their value as the next argument (`python -W ignore -m X`).
_OPTIONS_WITH_VALUE = ("-W", "-X")


def program_module(argv: list[str]) -> str:
    """The module of `python [options] -m MODULE ...`; "" for a script, `-c` or the REPL."""
    i = 1
    while i < len(argv):
        arg = argv[i]
        if arg == "-m":
            return argv[i + 1] if i + 1 < len(argv) else ""
        if arg.startswith("-m"):
            return arg[2:]
        if not arg.startswith("-") or arg in ("-", "-c") or arg.startswith("-c"):
            return ""
        i += 2 if arg in _OPTIONS_WITH_VALUE else 1
    return ""


if program_module(getattr(sys, "orig_argv", [])).split(".")[0] == "bertjax":
    host_memory.reexec_with_huge_pages()
    startup_collection.hold_during_imports()
