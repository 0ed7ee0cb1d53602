"""Evaluations of a trained encoder, one subcommand each:

    python -m bertjax.evaluate similarity --model PATH [--pooling mean ...]

`python -m bertjax.evaluate NAME --help` describes one. A subcommand is a module with
`main(argv)`, listed in COMMANDS; it is imported only when it runs.
"""

from __future__ import annotations

import importlib
import sys

from bertjax.core.errors import UserError, exit_on_user_error

# name -> (module with main(argv), what it measures)
COMMANDS = {
    "similarity": ("bertjax.evaluation.similarity",
                   "cosine similarity vs human ratings (Lee et al. 2005): Spearman, Pearson"),
}


def usage() -> str:
    lines = ["usage: python -m bertjax.evaluate NAME [options]", "", "subcommands:"]
    width = max(map(len, COMMANDS))
    lines += [f"  {name:<{width}}  {about}" for name, (_, about) in COMMANDS.items()]
    return "\n".join(lines)


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        return
    if not argv or argv[0] not in COMMANDS:
        given = f"unknown subcommand {argv[0]!r}" if argv else "no subcommand given"
        raise UserError(f"{given}; choose one of {', '.join(COMMANDS)} "
                        "(python -m bertjax.evaluate --help)")
    module, _ = COMMANDS[argv[0]]
    importlib.import_module(module).main(argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
