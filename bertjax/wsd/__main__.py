"""`python -m bertjax.wsd`: a documented command name; the command is `bertjax.cli.wsd`.

It runs that module as the program (runpy), so keeping the name adds no import from this layer
to the command-line layer."""

import runpy

if __name__ == "__main__":
    runpy.run_module("bertjax.cli.wsd", run_name="__main__", alter_sys=True)
