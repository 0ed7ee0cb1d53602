"""Evaluations of a trained encoder, one subcommand each:

    python -m bertjax.evaluate similarity --model PATH [--pooling mean ...] [--standardize STATS]
    python -m bertjax.evaluate anisotropy --model PATH --corpus FILE [--plot OUT.png]

`python -m bertjax.evaluate NAME --help` describes one. A subcommand is a command module's
`main(argv)`, listed in COMMANDS.
"""

from __future__ import annotations

import sys

from bertjax.cli import anisotropy, entry, similarity
from bertjax.core.errors import UserError

# name -> (its main(argv), what it measures)
COMMANDS = {
    "similarity": (similarity.main,
                   "cosine similarity vs human ratings (Lee et al. 2005): Spearman, Pearson"),
    "anisotropy": (anisotropy.main,
                   "per layer: random-token cosine, self-similarity, top-dimension variance; "
                   "raw, z-scored, all-but-the-top"),
}


def usage() -> str:
    lines = ["usage: python -m bertjax.evaluate NAME [options]", "", "subcommands:"]
    width = max(map(len, COMMANDS))
    lines += [f"  {name:<{width}}  {about}" for name, (_, about) in COMMANDS.items()]
    return "\n".join(lines)


@entry.command
def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    if argv and argv[0] in ("-h", "--help"):
        print(usage())
        return
    if not argv or argv[0] not in COMMANDS:
        given = f"unknown subcommand {argv[0]!r}" if argv else "no subcommand given"
        raise UserError(f"{given}; choose one of {', '.join(COMMANDS)} "
                        "(python -m bertjax.evaluate --help)")
    command, _ = COMMANDS[argv[0]]
    command(argv[1:])


if __name__ == "__main__":
    main(sys.argv[1:])
