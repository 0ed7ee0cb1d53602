"""A workdir on a bucket, worked on through a local mirror of its small files.

Checkpoints are written to the bucket directly (Orbax and TensorStore speak gs:// themselves,
shard by shard from every host, and Orbax marks a step complete only once all of it is there).
Everything else in a workdir is small and written as files by libraries that need a local file
system (TensorBoard's event writer appends, matplotlib, the corpus preparation's memory maps), so
it lives in a mirror on this host (a corpus prepared into the workdir without its shards, which a
run reads in place: data/streamed_corpus.py), $BERTJAX_CACHE/workdirs/<hash of the URL>/p<process>, that is
pulled from the bucket when the run opens and pushed back, file by file as whole objects, after
every checkpoint and when the run ends. A run killed between two pushes loses only the lines
logged since the last checkpoint, which a resume drops anyway (metrics after the checkpoint it
resumes from are truncated).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil

from bertjax.core import storage, transfer
from bertjax.core.packaged import cache_dir

CHECKPOINTS = "checkpoints"
READ_IN_PLACE = "data/shards/"  # the workdir's prepared corpus's tokens: pushed, never pulled
LOCK = ".lock"
STATE = ".bertjax-mirror.json"  # {relative path: [size, mtime_ns]} as last pulled or pushed


class WorkdirMirror:
    def __init__(self, url: str, process_index: int):
        self.url = storage.absolute(url)
        digest = hashlib.sha256(self.url.encode()).hexdigest()[:20]
        self.path = os.path.join(cache_dir(), "workdirs", digest, f"p{process_index}")
        self._pushed: dict[str, list[int]] = {}

    def pull(self) -> None:
        """Makes the mirror what the bucket holds (less checkpoints and the lock): files that
        changed are fetched again, files the bucket no longer has are removed."""
        remote = {name: entry for name, entry in transfer.remote_files(self.url).items()
                  if not _excluded(name) and not name.startswith(READ_IN_PLACE)}
        state = self._read_state()
        if os.path.isdir(self.path):
            for name in self._local_files():
                if name not in remote:
                    os.unlink(os.path.join(self.path, name))
            _remove_empty_directories(self.path)
        fs, inner = storage.filesystem(self.url)
        with storage.reported(self.url, "read"):
            for name, entry in remote.items():
                local = os.path.join(self.path, name)
                if state.get(name, {}).get("remote") == entry and os.path.exists(local):
                    continue
                os.makedirs(os.path.dirname(local), exist_ok=True)
                transfer.get_checked(fs, f"{inner}/{name}", local, entry)
                state[name] = {"remote": entry}
        state = {name: value for name, value in state.items() if name in remote}
        os.makedirs(self.path, exist_ok=True)
        self._write_state(state)
        self._pushed = {name: _stamp(os.path.join(self.path, name)) for name in state}

    def push(self, *, last: tuple[str, ...] = ("run.json",)) -> list[str]:
        """Uploads the files changed since the last pull or push; returns their names."""
        changed = [name for name in self._local_files()
                   if self._pushed.get(name) != _stamp(os.path.join(self.path, name))]
        if not changed:
            return []
        uploaded = transfer.upload_tree(self.path, self.url, last=last,
                                        only=lambda name: name in set(changed))
        for name in uploaded:
            self._pushed[name] = _stamp(os.path.join(self.path, name))
        return uploaded

    def discard(self) -> None:
        shutil.rmtree(self.path, ignore_errors=True)

    def _local_files(self) -> list[str]:
        if not os.path.isdir(self.path):
            return []
        names = [os.path.relpath(os.path.join(root, name), self.path)
                 for root, _, files in os.walk(self.path) for name in files]
        return sorted(name for name in names if name != STATE and not _excluded(name))

    def _read_state(self) -> dict:
        try:
            with open(os.path.join(self.path, STATE)) as f:
                return json.load(f)
        except (OSError, ValueError):
            return {}

    def _write_state(self, state: dict) -> None:
        with open(os.path.join(self.path, STATE), "w") as f:
            json.dump(state, f)


def _remove_empty_directories(top: str) -> None:
    """What the bucket no longer has leaves no directory behind (an empty tokenizer directory
    would read as a damaged one)."""
    for root, directories, files in os.walk(top, topdown=False):
        if root != top and not os.listdir(root):
            os.rmdir(root)


def _excluded(name: str) -> bool:
    return name == LOCK or name.startswith(CHECKPOINTS + "/") or name == CHECKPOINTS


def _stamp(path: str) -> list[int]:
    status = os.stat(path)
    return [status.st_size, status.st_mtime_ns]
