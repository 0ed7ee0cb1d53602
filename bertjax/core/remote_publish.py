"""The upload that puts a staged output (remote_output.py) at its URL, and what SIGTERM during it
leaves behind.

A directory is uploaded in this order: first UNFINISHED, an object naming the output's kind (so
an upload that stops, even by SIGKILL, is recognised as an unfinished output of that kind, which
--overwrite may replace); with overwrite, the old output's records next (a mix of old and new
objects must never pass for a whole output: readers know an output by its records); the new
objects; the old output's stale objects removed; the new records; UNFINISHED removed last. A
single file is one object, uploaded whole or not at all.

SIGTERM is honoured between two requests (termination.deferred_sigterm): a request cut off
mid-way could still land after its object was removed. The command then ends with
EXIT_TERMINATED and one line: for a new output, what was uploaded is removed (UNFINISHED last),
within the storage timeout, or the line names what remains and how to remove it; with overwrite,
the line says what state the old output is in.
"""

from __future__ import annotations

import json
import os
import shutil
import time

from bertjax.core import storage, termination
from bertjax.core.errors import UserError

UNFINISHED = ".bertjax-unfinished"


def put_object(fs, local: str, inner: str) -> None:
    """One file uploaded as one object (tests stop a command at an exact point here)."""
    fs.put_file(local, inner)


def unfinished_kind(target: str) -> str | None:
    """The kind named by an unfinished upload's UNFINISHED object at `target`, or None."""
    marker = storage.join(target, UNFINISHED)
    if not storage.isfile(marker):
        return None
    try:
        return str(json.loads(storage.read_bytes(marker))["kind"])
    except (ValueError, KeyError, TypeError):
        return "unknown kind"


class Upload:
    """One output's upload: what it has done so far, so that SIGTERM can say and undo it."""

    def __init__(self, local: str, target: str, path: str, *, staging: str, kind_name: str,
                 old: list[str]):
        """`local` (a file or directory in the local `staging` directory) goes to `target`,
        replacing the objects `old` (relative paths; [""] for a file) that are there."""
        self.local, self.target, self.path, self.kind_name = local, target, path, kind_name
        self.staging = staging
        self.old = [name for name in old if name != UNFINISHED]  # what overwrite replaces
        self.was_unfinished = UNFINISHED in old
        self.fs, self.inner = storage.filesystem(target)
        self.uploaded: list[str] = []
        self.removed: list[str] = []
        self.marked = False

    def run(self, records: list[str]) -> list[str]:
        """Uploads everything, records last; returns the relative paths uploaded. A storage
        error on the way is its one line, with what became of the objects (as for SIGTERM)."""
        with termination.deferred_sigterm() as pending:
            self.pending = pending
            try:
                return self._upload(records)
            except UserError as e:
                raise UserError(f"{e}; {self._undone()}") from None

    def _upload(self, records: list[str]) -> list[str]:
        if os.path.isfile(self.local):
            self._put(self.local, "")
            self._stop_if_asked()
            return [""]
        files = sorted(os.path.relpath(os.path.join(root, name), self.local)
                       for root, _, names in os.walk(self.local) for name in names)
        self._mark()
        for name in sorted(n for n in self.old if n.endswith(".json")):
            self._remove(name)
        for name in [f for f in files if f not in records] + records:
            self._put(os.path.join(self.local, name), name)
        for name in sorted(set(self.old) - set(files) - set(self.removed)):
            self._remove(name)
        self._stop_if_asked()
        with storage.reported(self.target, "write"):
            self.fs.rm_file(self._inner(UNFINISHED))
        return files

    def _inner(self, name: str) -> str:
        return f"{self.inner.rstrip('/')}/{name}" if name else self.inner

    def _mark(self) -> None:
        self._stop_if_asked()
        with storage.reported(self.target, "write"):
            self.fs.pipe_file(self._inner(UNFINISHED),
                              json.dumps({"kind": self.kind_name}).encode())
        self.marked = True

    def _put(self, local: str, name: str) -> None:
        self._stop_if_asked()
        with storage.reported(self.target, "write"):
            put_object(self.fs, local, self._inner(name))
        self.uploaded.append(name)

    def _remove(self, name: str) -> None:
        self._stop_if_asked()
        with storage.reported(self.target, "write"):
            self.fs.rm_file(self._inner(name))
        self.removed.append(name)

    def _stop_if_asked(self) -> None:
        if self.pending.arrived:
            shutil.rmtree(self.staging, ignore_errors=True)
            termination.end(f"stopped by SIGTERM while uploading {self.path}; "
                            f"{self._undone()}")

    def _undone(self) -> str:
        """What SIGTERM leaves: removes a new output's objects and says what is left."""
        touched = set(self.uploaded) | set(self.removed)
        if self.old == [""]:  # a file: one request replaces it whole
            return (f"the new {self.kind_name} had replaced the old one whole" if touched else
                    "nothing was replaced: the old output is unchanged")
        if self.old and touched:
            return self._old_state()
        if self.old:  # at most the marker was written
            if self.was_unfinished:
                return ("nothing was replaced: it is still the unfinished upload it was; re-run "
                        "with --overwrite to replace it")
            left = self._remove_all([UNFINISHED] if self.marked else [])
            return ("nothing was replaced: the old output is unchanged" if not left else
                    f"the old output is unchanged but still marked unfinished "
                    f"({storage.join(self.target, UNFINISHED)} could not be removed: "
                    f"{self.failure}); re-run with --overwrite to replace it")
        names = self.uploaded + ([UNFINISHED] if self.marked else [])
        if not names:
            return "nothing had been uploaded, and nothing older was changed"
        left = self._remove_all(names)
        if not left:
            return (f"the {len(self.uploaded)} object(s) already uploaded were removed and "
                    "nothing older was changed")
        # A removal that timed out may still land: the count is what may remain.
        return (f"up to {len(left)} partial object(s) remain at {self.target} ({self.failure}): "
                f"remove them with `gsutil -m rm -r {self.target}` or re-run with --overwrite")

    def _old_state(self) -> str:
        new = [n for n in self.uploaded if n not in self.old]
        replaced = [n for n in self.uploaded if n in self.old]
        return (f"the old {self.kind_name} at {self.target} is no longer whole: "
                f"{len([n for n in self.removed if n.endswith('.json')])} record(s) and "
                f"{len([n for n in self.removed if not n.endswith('.json')])} other object(s) "
                f"of it removed, {len(replaced)} of its {len(self.old)} objects replaced, "
                f"{len(new)} new ones added; it is marked unfinished: re-run with --overwrite "
                f"to complete the new output, or remove it with `gsutil -m rm -r {self.target}`")

    def _remove_all(self, names: list[str]) -> list[str]:
        """Removes `names` (UNFINISHED last) within the storage timeout; returns those left."""
        self.failure = ""
        if not storage.answered_so_far(self.target):
            self.failure = "the storage server stopped answering"
            return names
        deadline = time.monotonic() + storage.timeout_seconds()
        ordered = [n for n in names if n != UNFINISHED] + [n for n in names if n == UNFINISHED]
        for index, name in enumerate(ordered):
            left = deadline - time.monotonic()
            try:
                if left <= 0:
                    raise TimeoutError
                self.fs.rm_file(self._inner(name), timeout=left)
            except FileNotFoundError:
                continue
            except Exception as e:  # noqa: BLE001 (any failure: what is left is reported)
                self.failure = (f"removal did not finish within {storage.timeout_seconds():.0f}s"
                                if isinstance(e, TimeoutError) or "Timeout" in type(e).__name__
                                else f"removal failed: {type(e).__name__}")
                return ordered[index:]
        return []
