"""The entry point: `python -m bertjax.main --config=configs/base.py --workdir=DIR [--config.KEY=VALUE]`.

Runs the job the config names; running it again on the same workdir resumes. Exit status: 0 when
the job finished (or stopped cleanly on SIGTERM after writing a checkpoint), 2 with one line on
stderr for bad input or a bad config, 1 when training diverged (a non-finite loss), 75 with one
line on stderr when another process of a multi-process job was lost (bertjax.parallel.peer_loss).
"""

from __future__ import annotations

import sys

from absl import flags, logging

from bertjax import settings
from bertjax.cli import entry
from bertjax.cli.config_flags import overridden_keys, parse_config
from bertjax.core import packaged
from bertjax.core.errors import EXIT_BAD_INPUT, UserError, report
from bertjax.jobs import dispatch
from bertjax.parallel.distributed import initialize_from_environment
from bertjax.parallel.peer_loss import PeerLost, finish, leave, leaving_on_loss
from bertjax.train.metrics_log import NonFiniteLossError

EXIT_DIVERGED = 1
USAGE = "python -m bertjax.main --config=configs/base.py --workdir=DIR [--config.KEY=VALUE ...]"


def _parse(argv: list[str]):
    flag_values = flags.FlagValues()
    flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and prepared data.",
                        flag_values=flag_values)
    config, flag_values = parse_config(argv, flag_values, usage=USAGE,
                                       about=__doc__.split("\n\n", 1)[1])
    if not flag_values.workdir:
        raise UserError("--workdir is required")
    return config, flag_values.workdir


def run_job(config, workdir: str, overridden: frozenset = frozenset()) -> None:
    """Reads the settings (every check that needs no file), then runs the job they name."""
    s = settings.read(config, overridden)
    packaged.cache_dir()  # BERTJAX_CACHE checked before the workdir, whether this job uses it or not
    initialize_from_environment()
    with leaving_on_loss():
        dispatch.run(s, workdir)


@entry.command
def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv if argv is None else argv)
    # Orbax and absl report routine events as warnings; keep the terminal for what matters.
    logging.set_verbosity(logging.ERROR)
    try:
        config, workdir = _parse(argv)
        run_job(config, workdir, overridden_keys(argv))
    except PeerLost as e:
        leave(str(e))  # ends the process: exit status EXIT_PEER_LOST
    except UserError as e:
        finish()  # every process reports the same refusal: none of them is lost
        report(str(e))
        return EXIT_BAD_INPUT
    except NonFiniteLossError as e:
        finish()
        report(f"training diverged: {e}; lower optimizer.learning_rate or check the data")
        return EXIT_DIVERGED
    finish()
    return 0


if __name__ == "__main__":
    sys.exit(main())
