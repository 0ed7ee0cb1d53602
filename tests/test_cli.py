"""The command-line layer as a whole: every documented `python -m bertjax.X` command answers
--help with its usage and exit status 0, refuses a bad flag in exactly one stderr line with exit
status 2."""

import os
import re
import subprocess
import sys

import pytest

import cli_in_process

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DOCUMENTS = [os.path.join(REPO, "README.md")] + [
    os.path.join(REPO, "docs", name) for name in sorted(os.listdir(os.path.join(REPO, "docs")))
    if name.endswith(".md")]


def _module_file(name: str) -> str | None:
    """The file `python -m NAME` runs, if NAME is a module of this repository."""
    path = os.path.join(REPO, *name.split("."))
    for candidate in (path + ".py", os.path.join(path, "__main__.py")):
        if os.path.isfile(candidate):
            return candidate
    return None


def documented_commands() -> list[str]:
    """Every `python -m bertjax...` the README and docs name that is a module (not `bertjax.X`)."""
    names = set()
    for path in DOCUMENTS:
        with open(path, encoding="utf-8") as f:
            names.update(re.findall(r"python -m (bertjax(?:\.\w+)*)", f.read()))
    return sorted(name for name in names if _module_file(name))


COMMANDS = documented_commands()
# What a bad flag does after the command name: a subcommand's flags are refused too.
BAD_FLAGS = [(name, ("--no-such-flag",)) for name in COMMANDS] + [
    ("bertjax.evaluate", ("similarity", "--no-such-flag")),
    ("bertjax.index", ("build", "--no-such-flag")),
    ("bertjax.wsd", ("predict", "--no-such-flag")),
]


def command_module(name: str) -> str:
    """The module a documented command runs: the shim's runpy target, or the module itself."""
    with open(_module_file(name), encoding="utf-8") as f:
        found = re.search(r"run_module\(\s*\"([\w.]+)\"", f.read())
    return found.group(1) if found else name


def test_the_documented_commands_are_found():
    assert {"bertjax.main", "bertjax.data.prepare", "bertjax.data.inspect", "bertjax.export",
            "bertjax.convert", "bertjax.embed", "bertjax.index", "bertjax.evaluate",
            "bertjax.wsd", "bertjax.bench", "bertjax.retrieval.wiki_pairs"} <= set(COMMANDS)


@pytest.fixture(scope="module")
def helps() -> dict[str, subprocess.CompletedProcess]:
    """`python -m NAME --help` of every command, the processes started together."""
    started = {name: subprocess.Popen(
        [sys.executable, "-m", name, "--help"], cwd=REPO, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True) for name in COMMANDS}
    done = {}
    for name, process in started.items():
        stdout, stderr = process.communicate(timeout=300)
        done[name] = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    return done


@pytest.mark.parametrize("name", COMMANDS)
def test_help_prints_the_usage_and_exits_0(name, helps):
    run = helps[name]
    assert run.returncode == 0, run.stderr
    assert run.stdout.startswith(f"usage: python -m {name}"), run.stdout[:500]
    assert "Traceback" not in run.stderr, run.stderr


@pytest.mark.parametrize("name, args", BAD_FLAGS, ids=[" ".join((n,) + a) for n, a in BAD_FLAGS])
def test_a_bad_flag_is_one_stderr_line_and_exit_2(name, args):
    run = cli_in_process.run(command_module(name), *args)
    assert run.returncode == 2, (run.returncode, run.stderr)
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("bertjax: error: "), run.stderr
    assert run.stdout == ""


def test_the_library_log_filter_joins_absls_own_logger():
    """Orbax's routine warnings are dropped by the caller absl's logger records; a filter attached
    before absl made that logger would leave a plain logger that records absl as the caller, and
    those warnings would print (`WARNING:absl:Metadata file does not exist: ...`)."""
    code = ("import logging\nfrom bertjax.cli import entry\nentry.command(lambda: None)()\n"
            "logger = logging.getLogger('absl')\nprint(type(logger).__name__, len(logger.filters))")
    done = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True,
                          timeout=120, check=True)
    assert done.stdout.split() == ["ABSLLogger", "1"]
