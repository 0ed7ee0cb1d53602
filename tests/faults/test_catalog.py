"""Every command-line entry point against the catalog of bad input (catalog_cases.py): each case
must exit 2 with exactly one stderr line, `bertjax: error: ...` naming the reason, no traceback,
nothing on stdout, and leave every directory it names as it was (no file changed, nothing created:
a refused command creates no workdir or output). Exactly one line: a note or warning printed
before the refusal fails the case too, since what a command says about work it is about to do
waits until every refusal has been decided.

A case runs the command's main() in this process (cli_in_process: what it writes is caught at the
file descriptors), since what is tested is our code's refusal; the few in IN_A_PROCESS run as a
real `python -m bertjax.X`, each for the reason given. Each case's result is one test.
"""

import concurrent.futures
import dataclasses
import os
import time

import pytest

import bertjax
import cli_in_process
from bertjax import wsd
from faults.catalog_cases import CASES, SHARED, Case, write_files
from faults.file_trees import md5s
from pretrain_runs import REPO, run_cli, run_cli_afresh
from sense_examples import HAND_MADE

assert len({case.id for case in CASES}) == len(CASES), "case ids must be unique"

# Cases run as a real process, and why the process matters there.
IN_A_PROCESS = {
    # One per documented command name: the runpy shim, the interpreter's start-up and exit
    # (atexit handlers, library threads, import-time warnings) must add no line.
    "main-pretrain-unknown-key": "the bertjax.main shim",
    "prepare-input-binary": "the bertjax.data.prepare shim",
    "inspect-unknown-key": "the bertjax.data.inspect shim",
    "export-step-missing": "the bertjax.export shim (Orbax's logging at start-up and exit)",
    "convert-truncated-weights": "the bertjax.convert shim",
    "bench-unknown-key": "the bertjax.bench shim",
    "index-search-k-zero": "the bertjax.index shim",
    "embed-no-pooling": "the bertjax.embed shim",
    "evaluate-unknown-subcommand": "the bertjax.evaluate shim",
    "wsd-predict-index-missing": "the bertjax.wsd shim",
    # The refusal comes from the compiled step's memory: a plain one-device process's compile
    # (child_env), not the 8-device one of this process (slower to compile, other figures).
    "main-pretrain-does-not-fit-device-memory": "the memory of a one-device compiled step",
}
assert set(IN_A_PROCESS) <= {case.id for case in CASES}, "IN_A_PROCESS names unknown cases"


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
def shared(tmp_path_factory, finished_short_run, small_corpus_dir):
    """The inputs the cases share: a finished pretraining run, a fine-tuning run started from it,
    its params and Hugging Face exports, small data files; a retrieval index (exact and
    approximate), standardisation statistics and a sense index, each made with the pretraining
    run from a few lines of text (seconds each, in this process)."""
    root = tmp_path_factory.mktemp("catalog_shared")
    files = str(root / "files")
    write_files(files)
    finished = finished_short_run
    paths = {"cfg": os.path.join(REPO, "configs"), "pre": finished, "corpus": small_corpus_dir,
             "files": files, "ft": str(root / "ft"), "params": str(root / "params"),
             "hf": str(root / "hf"), "index": str(root / "index"), "stats": str(root / "stats"),
             "senses": str(root / "senses")}
    commands = [
        ("main", f"--config={paths['cfg']}/finetune_sentiment.py",
         f"--workdir={paths['ft']}", f"--config.init_checkpoint={finished}",
         f"--config.data.train={files}/train.tsv", f"--config.data.eval={files}/dev.tsv",
         "--config.data.max_seq_len=32", "--config.train.epochs=1",
         "--config.train.batch_size=8"),
        ("export", "--workdir", finished, "--format", "params", "--output", paths["params"]),
        ("export", "--workdir", finished, "--format", "hf", "--output", paths["hf"]),
        ("index", "build", "--model", finished, "--corpus", f"{files}/docs.jsonl",
         "--output", paths["index"], "--approximate"),
        ("embed", "--model", finished, "--fit-standardizer", f"{files}/docs.txt",
         "--pooling", "mean", "--output", os.path.join(paths["stats"], "mean.npz")),
    ]
    os.makedirs(paths["stats"])
    # The fine-tuning run in a one-device child at the least optimization (child_env): compiling
    # dominates it, and that compile is cheaper than this process's 8-device one.
    done = run_cli(f"bertjax.{commands[0][0]}", *commands[0][1:])
    assert done.returncode == 0, (done.args, done.stderr[-3000:])
    for command in commands[1:]:
        done = cli_in_process.run(*command)
        assert done.returncode == 0, (done.args, done.stderr[-3000:])
    # The sense index from four hand-made examples: `wsd fit` would read all of WordNet (17 s).
    wsd.SenseIndex.fit(bertjax.load(finished), HAND_MADE).save(paths["senses"])
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
    arguments = case.arguments(paths)
    started = time.perf_counter()
    if case.id in IN_A_PROCESS:
        done = run_cli_afresh(f"bertjax.{case.module}", *arguments)
    else:
        done = cli_in_process.run(case.module, *arguments)
    seconds = time.perf_counter() - started
    found = [f"{w}: {c}" for w in watched for c in changes(before[w], tree(w))]
    where = "" if case.id in IN_A_PROCESS else "(in-process) "
    return Outcome([f"{where}python", "-m", f"bertjax.{case.module}", *arguments],
                   done.returncode, done.stdout, done.stderr, found, seconds)


@pytest.fixture(scope="module")
def outcomes(shared, tmp_path_factory) -> dict[str, Outcome]:
    """Every case run once: the real processes two at a time in the background, the rest here."""
    root = tmp_path_factory.mktemp("catalog_cases")
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        futures = {case.id: pool.submit(run_case, case, shared, str(root / case.id))
                   for case in CASES if case.id in IN_A_PROCESS}
        found = {case.id: run_case(case, shared, str(root / case.id))
                 for case in CASES if case.id not in IN_A_PROCESS}
        found.update({name: future.result() for name, future in futures.items()})
    return found


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
