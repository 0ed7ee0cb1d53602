"""Session fixtures built once for the whole suite rather than once per xdist worker.

`make test` runs two workers and a session fixture is a per-process thing: each worker that needs
one builds its own. For those that take long (a fine-tuned run) or that most test files use,
the first worker to ask builds it into a directory both workers see, under a file lock; a worker
asking meanwhile waits for it and then reads the same files. These fixtures are only read by tests
(a test that changes one works on a copy), so sharing them changes nothing a test sees but the
path.
"""

import contextlib
import fcntl
import os
import pathlib
import shutil
import time
from typing import Callable

# The longest build (the sentiment run on a loaded machine) takes well under this; a worker that
# waits longer fails rather than hang the suite.
LOCK_TIMEOUT_S = 600


@contextlib.contextmanager
def _locked(path: pathlib.Path):
    """An exclusive flock on `path`, waited for at most LOCK_TIMEOUT_S (released when the holder
    ends, even killed)."""
    with open(path, "w") as lock:
        deadline = time.monotonic() + LOCK_TIMEOUT_S
        while True:
            try:
                fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{path} held for over {LOCK_TIMEOUT_S} s") from None
                time.sleep(0.2)
        yield


def _session_root(tmp_path_factory) -> pathlib.Path:
    """The directory of this run that every worker shares: under xdist each worker's base
    directory (pytest-N/popen-gwK) sits in it; without xdist it is the base directory itself."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if os.environ.get("PYTEST_XDIST_WORKER") else base


def built_once(tmp_path_factory, name: str, build: Callable[[str], None]) -> str:
    """The directory `build(directory)` fills, built by one worker of this run and kept.

    A build that raised, or a worker killed mid-build, leaves no completion mark: the next worker
    to ask starts it again from an empty directory.
    """
    root = _session_root(tmp_path_factory) / "built-once"
    root.mkdir(exist_ok=True)
    target, done = root / name, root / f"{name}.done"
    with _locked(root / f"{name}.lock"):
        if not done.exists():
            shutil.rmtree(target, ignore_errors=True)
            target.mkdir()
            build(str(target))
            done.touch()
    return str(target)
