"""The config on the command line: `--config=FILE [--config.KEY=VALUE ...]`, for the commands
that run on a job's config (`bertjax.main`, `bertjax.data.inspect`, `bertjax.bench`).

The config file and its overrides are absl flags (ml_collections' config_flags); a command may
add its own absl flags beside them. `-h` / `--help` prints the command's usage and flags.
"""

from __future__ import annotations

import os
import sys

from absl import flags
from ml_collections import config_flags

from bertjax.core.errors import UserError

HELP_FLAGS = ("-h", "--help")


def parse_config(argv: list[str], flag_values: flags.FlagValues | None = None, *,
                 usage: str = "", about: str = ""):
    """The config of `--config=FILE [--config.KEY=VALUE ...]` in argv (argv[0]: the program).

    `flag_values` may hold the caller's own flags, defined beforehand; returns (config, flags).
    With -h or --help in argv, prints `usage`, `about` and the flags, and exits with status 0.
    """
    # Fresh flag values per call: config_flags registers one flag per --config.KEY override, and
    # tests call main() many times in one process.
    flag_values = flags.FlagValues() if flag_values is None else flag_values
    config_flags.DEFINE_config_file("config", None, "Config file (a get_config() module).",
                                    flag_values=flag_values, lock_config=True)
    if any(arg in HELP_FLAGS for arg in argv[1:]):
        print(help_text(flag_values, usage, about))
        sys.exit(0)
    for arg in argv[1:]:
        if arg.startswith("--config="):
            path = arg.split("=", 1)[1].split(":", 1)[0]
            if not os.path.isfile(path):
                raise UserError(f"config file not found: {path}")
    # config_flags reads the --config.KEY overrides from sys.argv itself.
    sys.argv = argv
    try:
        flag_values(argv)  # loads the config file and applies the overrides
        config = flag_values.config
    except Exception as e:  # anything raised while loading a config file is a bad config
        text = _message(e)
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        raise UserError(f"bad flags or config: {' '.join(lines[:4]) or type(e).__name__}") from None
    if config is None:
        raise UserError("--config is required, e.g. --config=configs/base.py")
    return config, flag_values


def help_text(flag_values: flags.FlagValues, usage: str, about: str) -> str:
    lines = [f"usage: {usage}" if usage else "usage:", ""]
    if about:
        lines += [about.strip(), ""]
    lines.append("flags:")
    for name in sorted(flag_values):
        flag = flag_values[name]
        default = "" if flag.default is None else f" (default: {flag.default})"
        lines.append(f"  --{name}: {flag.help}{default}")
    lines.append("  --config.KEY=VALUE: set one key of the config file, e.g. "
                 "--config.train.steps=1000")
    return "\n".join(lines)


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
