"""The entry point: `python -m bertjax.main --config=configs/base.py --workdir=DIR [--config.KEY=VALUE]`.

Runs the job the config names; running it again on the same workdir resumes. Exit status: 0 when
the job finished (or stopped cleanly on SIGTERM after writing a checkpoint), 2 with one line on
stderr for bad input or a bad config, 1 when training diverged (a non-finite loss).
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # before the imports below, which a re-executed process redoes
    from bertjax.core import host_memory

    host_memory.reexec_with_huge_pages()

from absl import flags, logging
from ml_collections import config_flags

from bertjax.core.errors import EXIT_BAD_INPUT, UserError, report

EXIT_DIVERGED = 1


def parse_config(argv: list[str], flag_values: flags.FlagValues | None = None):
    """The config of `--config=FILE [--config.KEY=VALUE ...]` in argv (argv[0]: the program).

    `flag_values` may hold the caller's own flags, defined beforehand; returns (config, flags).
    """
    # Fresh flag values per call: config_flags registers one flag per --config.KEY override, and
    # tests call main() many times in one process.
    flag_values = flags.FlagValues() if flag_values is None else flag_values
    config_flags.DEFINE_config_file("config", None, "Config file (a get_config() module).",
                                    flag_values=flag_values, lock_config=True)
    for arg in argv[1:]:
        if arg.startswith("--config="):
            path = arg.split("=", 1)[1].split(":", 1)[0]
            if not os.path.isfile(path):
                raise UserError(f"config file not found: {path}")
    # config_flags reads the --config.KEY overrides from sys.argv itself.
    sys.argv = argv
    try:
        flag_values(argv)
        config = flag_values.config
        if config is not None:
            config.get("task")  # the file is loaded lazily: make a broken one fail here
    except Exception as e:  # anything raised while loading a config file is a bad config
        text = _message(e)
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        raise UserError(f"bad flags or config: {' '.join(lines[:4]) or type(e).__name__}") from None
    if config is None:
        raise UserError("--config is required, e.g. --config=configs/base.py")
    return config, flag_values


def _parse(argv: list[str]):
    flag_values = flags.FlagValues()
    flags.DEFINE_string("workdir", None, "Directory for checkpoints, metrics and prepared data.",
                        flag_values=flag_values)
    config, flag_values = parse_config(argv, flag_values)
    if not flag_values.workdir:
        raise UserError("--workdir is required")
    return config, flag_values.workdir


def _message(error: BaseException) -> str:
    """The readable text of an exception from config loading (unwrapping KeyError's quoting)."""
    while error.args and isinstance(error.args[0], BaseException):
        error = error.args[0]
    if isinstance(error, KeyError) and error.args:
        text = str(error.args[0])
        if "Did you mean" in text or text.startswith("'"):
            return "unknown config key " + text
        return text
    return str(error)


def overridden_keys(argv: list[str]) -> frozenset:
    """The config keys set on the command line: --config.KEY=VALUE or --config.KEY VALUE."""
    return frozenset(arg[len("--config."):].split("=", 1)[0] for arg in argv
                     if arg.startswith("--config."))


def run_job(config, workdir: str, overridden: frozenset = frozenset()) -> None:
    """Reads the settings (every check that needs no file), then runs the job they name."""
    from bertjax import settings as settings_lib

    s = settings_lib.read(config, overridden)
    from bertjax.parallel.distributed import initialize_from_environment

    initialize_from_environment()
    if isinstance(s, settings_lib.PretrainSettings):
        from bertjax.jobs import pretrain

        pretrain.run(s, workdir)
    else:
        from bertjax.jobs import finetune

        finetune.run(s, workdir)


def main(argv: list[str] | None = None) -> int:
    # Orbax and absl report routine events as warnings; keep the terminal for what matters.
    logging.set_verbosity(logging.ERROR)
    from bertjax.train.metrics_log import NonFiniteLossError

    try:
        config, workdir = _parse(list(sys.argv if argv is None else argv))
        run_job(config, workdir, overridden_keys(list(sys.argv if argv is None else argv)))
    except UserError as e:
        report(str(e))
        return EXIT_BAD_INPUT
    except NonFiniteLossError as e:
        report(f"training diverged: {e}; lower optimizer.learning_rate or check the data")
        return EXIT_DIVERGED
    return 0


if __name__ == "__main__":
    sys.exit(main())
