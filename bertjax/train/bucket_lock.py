"""One run per workdir on a bucket: the lock object WORKDIR/.lock, created only if absent.

A bucket has no flock and nothing drops a lock when its holder dies, so the lock is a lease:

- taken by creating the object under the precondition "no generation yet" (ifGenerationMatch=0),
  which the store applies atomically: of two runs starting at once, one creates it;
- refreshed by its holder every REFRESH_S seconds, each rewrite conditioned on the generation it
  wrote last, so a holder that lost the lease learns it instead of overwriting the new holder;
- taken over when stale (not refreshed for STALE_S seconds: its holder died without releasing),
  or at once when its holder was a process of this host that no longer exists, conditioned on
  the stale generation, so of two runs taking over at once one wins;
- deleted on release, conditioned on its own generation.

The object is read before it is written, and read back after: it must then name this holder (a
random token). Stores and emulators that ignore preconditions (gcp-storage-emulator does) thus
still refuse a second run, and let only one of two racing writers go on (the last to write). Staleness compares the holder's wall-clock
`refreshed` time with this host's: TPU VMs keep their clocks in sync (NTP), and STALE_S is
minutes, far beyond any skew.

An object that holds no lease note (not JSON, or no `refreshed` time: nothing bertjax writes) says
nothing about its holder, so its own last-written time stands for the refresh: written within
STALE_S it refuses the run in one line naming the object; older, it is taken over with a line.
"""

from __future__ import annotations

import datetime
import json
import os
import secrets
import socket
import sys
import threading
import time

from bertjax.core import storage, storage_deadline
from bertjax.core.errors import UserError

REFRESH_S = 30.0
STALE_S = 180.0


class BucketLock:
    def __init__(self, workdir: str, *, refresh_s: float = REFRESH_S, stale_s: float = STALE_S):
        self.workdir = storage.absolute(workdir)
        self.url = storage.join(self.workdir, ".lock")
        self.refresh_s, self.stale_s = refresh_s, stale_s
        self.fs, self._object = storage.filesystem(self.url)
        self._bucket, self._key = self._object.split("/", 1)
        self._token = secrets.token_hex(8)
        self._since = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        self._generation: str | None = None
        self._stop = threading.Event()
        self._refresher: threading.Thread | None = None
        self.lost = False

    @property
    def held(self) -> bool:
        return self._generation is not None

    def acquire(self) -> None:
        """Takes the lease or raises UserError naming its holder."""
        if self.held:
            return
        with storage.reported(self.url, "lock"):
            self.fs.invalidate_cache()
            try:
                if self.fs.exists(self._object):
                    self._take_over_if_stale()
                else:
                    self._write(if_generation="0")
            except FileExistsError:  # created since it was looked for
                self._take_over_if_stale()
            self._confirm()
        self._refresher = threading.Thread(target=self._refresh_loop, daemon=True,
                                           name="bertjax-bucket-lock")
        self._refresher.start()

    def release(self, *, quiet: bool = False) -> None:
        """Deletes the lease; `quiet`: a lease that cannot be deleted (the storage server is
        gone) is left to go stale without a word, for a run that already reported an error."""
        if not self.held:
            return
        self._stop.set()
        if self._refresher is not None:
            self._refresher.join(timeout=self.refresh_s + storage.timeout_seconds())
        generation, self._generation = self._generation, None
        if self.lost:
            return
        try:
            with storage_deadline.unfinished(
                    f"the lease {self.url} stays: the next run on this host takes it over at "
                    f"once, elsewhere after {self.stale_s:.0f}s"), \
                    storage_deadline.bounded(self.url, "release the lock"):
                self.fs.call("DELETE", "b/{}/o/{}", self._bucket, self._key,
                             ifGenerationMatch=generation)
        except Exception as e:  # an unreleased lease goes stale: the next run takes it over
            if not quiet:
                print(f"bertjax: could not release the lock {self.url} ({type(e).__name__}); the "
                      f"next run takes it over after {self.stale_s:.0f}s", file=sys.stderr)

    def abandon(self) -> None:
        """Stops refreshing the lease and leaves it (its server does not answer, so a delete
        would wait out the timeout): it goes stale, or the next run on this host takes it over
        as soon as this process has ended."""
        self._stop.set()
        self._generation = None

    def __enter__(self) -> "BucketLock":
        self.acquire()
        return self

    def __exit__(self, *exc) -> None:
        self.release()

    def _note(self) -> bytes:
        return json.dumps({"host": socket.gethostname(), "pid": os.getpid(),
                           "since": self._since, "refreshed": time.time(),
                           "token": self._token}).encode()

    def _write(self, *, if_generation: str) -> None:
        written = self.fs.call(
            "POST", f"{self.fs._location}/upload/storage/v1/b/{self._bucket}/o",
            uploadType="media", name=self._key, ifGenerationMatch=if_generation,
            data=self._note(), json_out=True)
        self._generation = str(written["generation"])

    def _read(self) -> tuple[dict, str, float | None]:
        """(the note, its generation, the object's age when the note is not a lease's);
        generation first: a takeover conditioned on it fails if the note changed after it was
        read."""
        self.fs.invalidate_cache()
        info = self.fs.info(self._object)
        try:
            note = json.loads(self.fs.cat_file(self._object))
        except ValueError:
            note = None
        if isinstance(note, dict) and isinstance(note.get("refreshed"), (int, float)):
            return note, str(info["generation"]), None
        written_at = info.get("mtime")  # gcsfs's reading of the object's `updated` time
        age = time.time() - written_at.timestamp() if written_at else 0.0
        return {}, str(info["generation"]), age

    def _take_over_if_stale(self) -> None:
        note, generation, written = self._read()
        age = time.time() - float(note.get("refreshed") or 0) if written is None else written
        dead = _died_on_this_host(note)
        if written is not None and age <= self.stale_s:
            raise UserError(f"the lock {self.url} holds no lease note bertjax wrote (written "
                            f"{max(age, 0):.0f}s ago); if no run uses workdir {self.workdir}, "
                            f"delete it, or run again after {self.stale_s:.0f}s to take it over")
        if age <= self.stale_s and not dead:
            raise self._busy(note, age)
        why = ("is no longer running" if dead else f"has not refreshed it for {age:.0f}s"
               if written is None else f"left no note; the object is {age:.0f}s old")
        print(f"bertjax: taking over the lock of {self.workdir}: its holder "
              f"({_holder(note)}) {why}", file=sys.stderr)
        try:
            self._write(if_generation=generation)
        except FileExistsError:
            note, _, _ = self._read()
            raise self._busy(note, time.time() - float(note.get("refreshed") or 0)) from None

    def _confirm(self) -> None:
        """The object names this holder: otherwise another writer came last, and holds it."""
        note, generation, _ = self._read()
        if note.get("token") != self._token:
            self._generation = None
            raise self._busy(note, time.time() - float(note.get("refreshed") or 0))
        self._generation = generation

    def _busy(self, note: dict, age: float) -> UserError:
        return UserError(f"workdir {self.workdir} is in use by {_holder(note)} (its lock was "
                         f"refreshed {max(age, 0):.0f}s ago); wait for it or use another "
                         "workdir")

    def _refresh_loop(self) -> None:
        while not self._stop.wait(self.refresh_s):
            try:
                with storage_deadline.bounded(self.url, "refresh the lock"):
                    self._write(if_generation=self._generation or "0")
            except FileExistsError:
                self.lost = True
                print(f"bertjax: lost the lock of {self.workdir} to another run; this run's "
                      "checkpoints may be overwritten by it", file=sys.stderr, flush=True)
                return
            except Exception:
                continue  # a storage hiccup: the next refresh tries again, long before STALE_S


def _died_on_this_host(note: dict) -> bool:
    """A holder on this host whose process is gone (a run killed here and started again) need
    not be waited for."""
    if note.get("host") != socket.gethostname():
        return False
    try:
        os.kill(int(note["pid"]), 0)
    except ProcessLookupError:
        return True
    except (KeyError, TypeError, ValueError, PermissionError):
        return False
    return False


def _holder(note: dict) -> str:
    try:
        return f"pid {int(note['pid'])} on host {note['host']} (since {note['since']})"
    except (KeyError, TypeError, ValueError):
        return "another process"
