"""A job's workdir: checked without writing anything, then opened (created, locked, recorded).

`run.json` records what the checkpoints in the workdir were made with (the task, model shape,
vocabulary, objective or heads). Running again with a different one is refused by name before the
workdir is touched; the record is written only once the run has really started (its state restored
or initialized), so a refused command never changes it. While a run holds the workdir, a second
run on it is refused by the lock (WORKDIR/.lock names the holder).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile

import jax

from bertjax.core.atomic_files import write_json
from bertjax.core.errors import UserError
from bertjax.data.corpus import MANIFEST
from bertjax.inference import loading
from bertjax.train.workdir_lock import WorkdirLock

RUN_RECORD = loading.RUN_RECORD


class RunDirectory:
    def __init__(self, path: str):
        self.given = path
        self.path = os.path.abspath(path)
        if os.path.exists(self.path) and not os.path.isdir(self.path):
            raise UserError(f"workdir {path} exists and is not a directory")
        self.stored = loading.read_json(os.path.join(self.path, RUN_RECORD))
        self._created = False
        self._lock: WorkdirLock | None = None

    def check(self, compared: dict) -> None:
        """Refuses a run whose `compared` entries differ from the stored record's (no write).

        Only these keys are compared, so settings that do not change the checkpoint layout
        (learning rate, steps) never invalidate a workdir."""
        for key, value in compared.items():
            if key in self.stored and self.stored[key] != value:
                raise UserError(f"workdir {self.given} holds a run with "
                                f"{key}={_short(self.stored[key])}, this config has "
                                f"{key}={_short(value)}; use a new workdir")

    def open(self) -> "RunDirectory":
        """Creates the workdir when missing, proves it writable and takes its lock (process 0)."""
        self._created = not os.path.exists(self.path)
        try:
            os.makedirs(self.path, exist_ok=True)
            with tempfile.NamedTemporaryFile(dir=self.path, prefix=".write-probe-"):
                pass
        except OSError as e:
            raise UserError(f"workdir {self.given} is not writable: {e.strerror or e}") from None
        if jax.process_index() == 0:
            self._lock = WorkdirLock(self.path)
            self._lock.acquire()
        return self

    def write_record(self, compared: dict, info: dict) -> None:
        """Stores `compared` (checked again) and `info` (uncompared: what later tools read)."""
        self.check(compared)
        if jax.process_index() != 0:
            return
        merged = {**self.stored, **compared, **info}
        if merged == self.stored:
            return
        write_json(os.path.join(self.path, RUN_RECORD), merged, sort_keys=True)
        self.stored = merged

    def close(self, *, failed: bool) -> None:
        """Releases the lock. A workdir this run created is removed again when the run failed
        before saving anything worth keeping (a checkpoint, or a prepared corpus)."""
        if self._lock is not None:
            self._lock.release()
            self._lock = None
        if failed and self._created and jax.process_index() == 0 and not self._holds_work():
            shutil.rmtree(self.path, ignore_errors=True)

    def _holds_work(self) -> bool:
        return bool(loading.checkpoint_steps(self.path)) or os.path.exists(
            os.path.join(self.path, "data", MANIFEST))

    def __enter__(self) -> "RunDirectory":
        return self.open()

    def __exit__(self, kind, error, trace) -> None:
        self.close(failed=kind is not None)


def _short(value) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 200 else text[:197] + "..."
