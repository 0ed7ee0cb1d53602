"""bertjax.core.startup_collection: a command process imports with the garbage collector off, and
its main runs with it on and the imported objects frozen; anything else is left as it is."""

import gc
import json
import os
import subprocess
import sys

from bertjax.core import startup_collection

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Loaded by the child before anything else: counts the collector's passes until the child exits,
# then writes what it saw.
SITECUSTOMIZE = """
import atexit, gc, json, os
passes = []
gc.callbacks.append(lambda phase, info: phase == "start" and passes.append(info["generation"]))
def write():
    with open(os.environ["COLLECTOR_REPORT"], "w") as f:
        json.dump({"passes": passes, "frozen": gc.get_freeze_count(),
                   "enabled": gc.isenabled()}, f)
atexit.register(write)
"""


def collector_seen_by(tmp_path, *args) -> dict:
    (tmp_path / "sitecustomize.py").write_text(SITECUSTOMIZE)
    report = tmp_path / "report.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [
        str(tmp_path), os.environ.get("PYTHONPATH")])), "COLLECTOR_REPORT": str(report)}
    done = subprocess.run([sys.executable, *args], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(report.read_text())


def test_a_command_imports_without_collecting_then_runs_with_the_imports_frozen(tmp_path):
    seen = collector_seen_by(tmp_path, "-m", "bertjax.main", "--help")
    assert seen["enabled"] and seen["frozen"] > 50_000, seen
    # What importing the same modules costs anywhere else: full passes over the growing heap.
    plain = collector_seen_by(tmp_path, "-c", "import bertjax.cli.main")
    assert plain["frozen"] == 0 and plain["passes"].count(2) >= 2, plain
    assert seen["passes"].count(2) < plain["passes"].count(2), (seen, plain)


def test_resuming_is_once_and_never_overrides_a_collector_turned_off_before(monkeypatch):
    monkeypatch.setattr(startup_collection, "_held", False)
    assert gc.isenabled()
    try:
        startup_collection.hold_during_imports()
        assert not gc.isenabled()
        startup_collection.resume_after_imports()
        assert gc.isenabled() and gc.get_freeze_count() > 0
        startup_collection.resume_after_imports()  # a second main in the process: nothing more
        assert gc.isenabled()
        gc.disable()  # the program's own choice
        startup_collection.hold_during_imports()
        startup_collection.resume_after_imports()
        assert not gc.isenabled()
    finally:
        gc.unfreeze()
        gc.enable()
