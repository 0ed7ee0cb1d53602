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
import tempfile

import jax

from bertjax.core import storage
from bertjax.core.atomic_files import write_json
from bertjax.core.errors import UserError
from bertjax.data.corpus import MANIFEST
from bertjax.inference import loading
from bertjax.jobs.workdir_mirror import WorkdirMirror
from bertjax.train.bucket_lock import BucketLock
from bertjax.train.metrics_log import read_metrics
from bertjax.train.workdir_lock import WorkdirLock

RUN_RECORD = loading.RUN_RECORD


class RunDirectory:
    """`location` is where the workdir is (an absolute path, or a URL such as gs://bucket/run);
    `path` the local directory the run writes its files in: the workdir itself, or the mirror of
    a workdir on a bucket (workdir_mirror.py), whose checkpoints go to `location` directly."""

    def __init__(self, path: str):
        self.given = path
        self.location = storage.absolute(path)
        self.remote = storage.is_url(path)
        self._mirror: WorkdirMirror | None = None
        if self.remote:
            _check_bucket(self.location)
            self._mirror = WorkdirMirror(self.location, jax.process_index())
            self._mirror.pull()  # read-only: what the record and the checks below see
            self.path = self._mirror.path
        else:
            self.path = self.location
            if os.path.exists(self.path) and not os.path.isdir(self.path):
                raise UserError(f"workdir {path} exists and is not a directory")
        self.stored = self._read_record()
        with loading.named_errors(self.location, self.path):
            read_metrics(self.path)  # a damaged line is refused before anything is written
        self._created = False
        self._lock: WorkdirLock | BucketLock | None = None

    @property
    def checkpoints(self) -> str:
        """Where the run's checkpoints are (the workdir, local or on the bucket)."""
        return self.location

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
        if self.remote:
            return self._open_remote()
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

    def _open_remote(self) -> "RunDirectory":
        self._created = not storage.exists(self.location)
        if jax.process_index() == 0:
            self._lock = BucketLock(self.location)
            self._lock.acquire()
        self._mirror.pull()  # again: what the bucket holds now that this run holds it
        self.stored = self._read_record()
        return self

    def _read_record(self) -> dict:
        """The stored run.json; a damaged one is refused naming the workdir's own path (the
        bucket's object, not this host's mirror of it)."""
        with loading.named_errors(self.location, self.path):
            return loading.read_json(os.path.join(self.path, RUN_RECORD))

    def pull(self) -> None:
        """A workdir on a bucket: the mirror refreshed (what another process pushed)."""
        if self._mirror is not None:
            self._mirror.pull()

    def push(self) -> None:
        """A workdir on a bucket: the files written since the last push, uploaded (process 0)."""
        if self._mirror is not None and jax.process_index() == 0 and self._lock is not None:
            self._mirror.push()

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
        self.push()

    def close(self, *, failed: bool) -> None:
        """Releases the lock. A workdir this run created is removed again when the run failed
        before saving anything worth keeping (a checkpoint, or a prepared corpus)."""
        if failed and self._mirror is not None and not storage.answered_so_far(self.location):
            # The bucket's server stopped answering: every request below would wait out the
            # timeout again. Everything stays as it is (what was not pushed since the last
            # checkpoint is logged again when the run resumes from it).
            if isinstance(self._lock, BucketLock):
                self._lock.abandon()
            self._lock = None
            return
        try:
            self.push()
        except UserError:
            if not failed:
                raise
            # The run's own error is the one to report; what was not pushed since the last
            # checkpoint is logged again when the run resumes from it.
        finally:
            if self._lock is not None:
                self._lock.release(quiet=failed)
                self._lock = None
        if failed and self._created and jax.process_index() == 0:
            try:
                if self._holds_work():
                    return
                storage.remove(self.location)
            except UserError:
                return  # the storage does not answer: keep everything; the run's error stands
            if self._mirror is not None:
                self._mirror.discard()

    def _holds_work(self) -> bool:
        return bool(loading.checkpoint_steps(self.location)) or os.path.exists(
            os.path.join(self.path, "data", MANIFEST))

    def __enter__(self) -> "RunDirectory":
        return self.open()

    def __exit__(self, kind, error, trace) -> None:
        self.close(failed=kind is not None)


def _check_bucket(url: str) -> None:
    """A workdir URL whose bucket is missing, or whose store cannot hold a run lock, is refused
    before anything is written."""
    if storage.scheme(url) not in ("gs", "gcs"):
        storage.filesystem(url)  # a scheme with no backend installed: what to install
        raise UserError(f"workdir {url}: a workdir on a bucket must be on gs:// (the run lock "
                        "needs Cloud Storage's generation preconditions); other stores serve "
                        "inputs and outputs only")
    storage.check_output_url(url, "a workdir")


def _short(value) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 200 else text[:197] + "..."
