"""`python -m bertjax.compile`: a documented command name; the command is `bertjax.cli.compile`.

It runs that module as the program (runpy), so keeping the name adds no import from this layer
to the command-line layer."""

import runpy

if __name__ == "__main__":
    runpy.run_module("bertjax.cli.compile", run_name="__main__", alter_sys=True)
