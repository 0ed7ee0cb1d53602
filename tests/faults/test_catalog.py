"""Every command-line entry point against the catalog of bad input (catalog_cases.py): each case
is a real `python -m bertjax.X` subprocess that must exit 2 with exactly one stderr line,
`bertjax: error: ...` naming the reason, no traceback, nothing on stdout, and leave every
directory it names as it was (no file changed, nothing created: a refused command creates no
workdir or output). Exactly one line: a note or warning printed before the refusal fails the case
too, since what a command says about work it is about to do waits until every refusal has been
decided.

The subprocesses run four at a time; each case's result is one test.
"""

import concurrent.futures
import dataclasses
import os
import time

import pytest

from faults.catalog_cases import CASES, SHARED, Case, write_files
from faults.test_inputs import md5s
from faults.test_runs import finished, run_cli  # noqa: F401  (finished: a fixture used here)
from pretrain_runs import REPO

WORKERS = 4
assert len({case.id for case in CASES}) == len(CASES), "case ids must be unique"


def tree(root: str) -> dict[str, str]:
    """Every file under `root` with its md5, and every directory (root included) as "dir"."""
    if not os.path.exists(root):
        return {}
    found = md5s(root)
    if os.path.isdir(root):
        found["."] = "dir"
    for directory, dirs, _ in os.walk(root):
        for name in dirs:
            found[os.path.relpath(os.path.join(directory, name), root)] = "dir"
    return found


def changes(before: dict, after: dict) -> list[str]:
    return ([f"new: {p}" for p in sorted(after.keys() - before.keys())]
            + [f"gone: {p}" for p in sorted(before.keys() - after.keys())]
            + [f"changed: {p}" for p in sorted(before.keys() & after.keys())
               if before[p] != after[p]])


@pytest.fixture(scope="module")
def shared(tmp_path_factory, finished, small_corpus_dir):  # noqa: F811
    """The inputs the cases share: a finished pretraining run (test_runs' `finished`), a
    fine-tuning run started from it, its params and Hugging Face exports, small data files."""
    root = tmp_path_factory.mktemp("catalog_shared")
    files = str(root / "files")
    write_files(files)
    paths = {"cfg": os.path.join(REPO, "configs"), "pre": finished, "corpus": small_corpus_dir,
             "files": files, "ft": str(root / "ft"), "params": str(root / "params"),
             "hf": str(root / "hf")}
    commands = [
        ("bertjax.cli.main", f"--config={paths['cfg']}/finetune_sentiment.py",
         f"--workdir={paths['ft']}", f"--config.init_checkpoint={finished}",
         f"--config.data.train={files}/train.tsv", f"--config.data.eval={files}/dev.tsv",
         "--config.data.max_seq_len=32", "--config.train.epochs=1",
         "--config.train.batch_size=8"),
        ("bertjax.cli.export", "--workdir", finished, "--format", "params", "--output",
         paths["params"]),
        ("bertjax.cli.export", "--workdir", finished, "--format", "hf", "--output", paths["hf"]),
    ]
    with concurrent.futures.ThreadPoolExecutor(len(commands)) as pool:
        for done in pool.map(lambda args: run_cli(*args), commands):
            assert done.returncode == 0, (done.args, done.stderr[-3000:])
    return paths


@dataclasses.dataclass
class Outcome:
    command: list[str]
    returncode: int
    stdout: str
    stderr: str
    changes: list[str]
    seconds: float


def run_case(case: Case, shared: dict, tmp: str) -> Outcome:
    os.makedirs(tmp)
    paths = {**shared, "tmp": tmp, "new": os.path.join(tmp, "new")}
    if case.setup is not None:
        case.setup(tmp, paths)
    watched = [tmp] + [shared[name] for name in sorted(case.named() & set(SHARED))]
    before = {w: tree(w) for w in watched}
    command = [f"bertjax.{case.module}", *case.arguments(paths)]
    started = time.perf_counter()
    done = run_cli(*command)
    seconds = time.perf_counter() - started
    found = [f"{w}: {c}" for w in watched for c in changes(before[w], tree(w))]
    return Outcome(["python", "-m", *command], done.returncode, done.stdout, done.stderr, found,
                   seconds)


@pytest.fixture(scope="module")
def outcomes(shared, tmp_path_factory) -> dict[str, Outcome]:
    """Every case run once, WORKERS subprocesses at a time."""
    root = tmp_path_factory.mktemp("catalog_cases")
    with concurrent.futures.ThreadPoolExecutor(WORKERS) as pool:
        futures = {case.id: pool.submit(run_case, case, shared, str(root / case.id))
                   for case in CASES}
        return {name: future.result() for name, future in futures.items()}


@pytest.mark.parametrize("case", CASES, ids=[case.id for case in CASES])
def test_bad_input_is_refused_in_one_line_and_changes_nothing(case, outcomes):
    o = outcomes[case.id]
    shown = (f"{' '.join(o.command)}\nexit {o.returncode} after {o.seconds:.1f} s\n"
             f"stderr:\n{o.stderr[-3000:]}")
    assert "Traceback" not in o.stderr + o.stdout, shown
    assert o.returncode == 2, shown
    assert not o.stdout, f"{shown}\nstdout:\n{o.stdout[-2000:]}"
    lines = o.stderr.splitlines()
    assert len(lines) == 1, shown
    assert lines[0].startswith("bertjax: error: ") and lines[0][len("bertjax: error: "):].strip(), \
        shown
    assert case.expect in lines[0], shown
    assert not o.changes, f"{shown}\nchanged on disk:\n" + "\n".join(o.changes)
