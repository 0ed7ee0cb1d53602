"""Outputs whose target is a URL (an export, an index, embeddings on gs://): output_dir's promise,
kept as far as an object store allows.

The output is built in a local staging copy (removed whatever stops the command, SIGTERM
included), then uploaded object by object (remote_publish.py), the JSON records last: readers
identify an output by its record (bertjax.json, manifest.json), so one interrupted upload is not
taken for a whole output, and an upload is marked unfinished until it is complete. What is
checked before any work, as locally: a bucket's root is no output; an existing target is
refused without overwrite; with overwrite, only an output of the same kind is replaced, whole or
an unfinished upload of one; never an input. A bucket has no rename, so two commands writing one
URL at once are caught only when the second finishes and finds the first's objects (the final
check), and an overwritten output is replaced object by object: SIGTERM then leaves a line saying
what state it is in.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import IO, Iterable, Iterator

from bertjax.core import remote_publish, storage, storage_deadline, termination, transfer
from bertjax.core.errors import UserError
from bertjax.core.packaged import cache_dir


def check_target(path: str, *, overwrite: bool, kind, sources: Iterable[str | None]) -> str:
    storage.check_output_url(path, f"a {kind.name}")
    target = storage.absolute(path)
    for source in sources:
        if source and storage.is_url(source):
            source = storage.absolute(source)
            if target == source or source.startswith(target + "/"):
                raise UserError(f"the output {path} would replace the input {source}; "
                                "choose another output")
            if target.startswith(source + "/"):
                raise UserError(f"the output {path} would be written inside the input "
                                f"{source}; choose another output")
    if storage.exists(target):
        _refuse_existing(target, path, overwrite=overwrite, kind=kind)
    return target


def _refuse_existing(target: str, path: str, *, overwrite: bool, kind,
                     meanwhile: bool = False) -> None:
    """What is at `target` may be replaced only with overwrite, and only if it is an output of
    `kind`, whole or an upload of one that stopped before it was complete."""
    unfinished = remote_publish.unfinished_kind(target) if kind.directory else None
    remove = f"remove it with `gsutil -m rm -r {target}`"
    if unfinished is not None:
        if not overwrite:
            raise UserError(f"{path} holds an unfinished upload of a {unfinished} (stopped "
                            "before it was complete): re-run with --overwrite to replace it, or "
                            f"{remove}")
        if unfinished != kind.name:
            raise UserError(f"{path} holds an unfinished upload of a {unfinished}, not a "
                            f"{kind.name}; --overwrite replaces only a {kind.name}: choose "
                            f"another output or {remove}")
        return
    if not overwrite:
        raise UserError(f"{path} already exists"
                        f"{' (another command wrote it meanwhile)' if meanwhile else ''}; "
                        "choose a new output or pass --overwrite")
    if not _holds(target, kind):
        raise UserError(f"{path} is not a {kind.name}; --overwrite replaces only a {kind.name} "
                        f"(one with its record, or an unfinished upload bertjax marked as such): "
                        "choose another output")


def _holds(target: str, kind) -> bool:
    """Whether the object(s) at `target` are an output of `kind`, judged on a local copy (of a
    directory, its JSON records alone: what every kind is recognised by)."""
    if kind.directory != storage.isdir(target):
        return False
    if not kind.directory:
        return kind.holds(transfer.local_copy(target))
    try:
        copy = transfer.local_copy(target, skip=lambda name: not name.endswith(".json"))
    except UserError:  # no JSON record at all
        return False
    return kind.holds(copy)


@contextlib.contextmanager
def staged(path: str, *, overwrite: bool, kind, sources: Iterable[str | None] = ()
           ) -> Iterator[str]:
    target = check_target(path, overwrite=overwrite, kind=kind, sources=sources)
    staging = _staging_directory()
    try:
        with _sigterm_removes(staging, path):
            yield staging
        _publish(staging, staging, target, path, overwrite=overwrite, kind=kind)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def staged_file(path: str, *, overwrite: bool, kind, sources: Iterable[str | None] = (),
                mode: str = "wb") -> Iterator[IO]:
    target = check_target(path, overwrite=overwrite, kind=kind, sources=sources)
    staging = _staging_directory()
    try:
        local = os.path.join(staging, storage.basename(target))
        with _sigterm_removes(staging, path), \
                open(local, mode, encoding=None if "b" in mode else "utf-8") as f:
            yield f
        _publish(local, staging, target, path, overwrite=overwrite, kind=kind)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _sigterm_removes(staging: str, path: str):
    """SIGTERM while the output is built: the local copy is removed, nothing was uploaded."""

    def clean_up() -> str:
        shutil.rmtree(staging, ignore_errors=True)
        return (f"stopped by SIGTERM before the output {path} was complete; the unfinished "
                "output was removed here and nothing was uploaded or changed")

    return termination.ended_by_sigterm(clean_up)


def _staging_directory() -> str:
    home = os.path.join(cache_dir(), "outputs")
    os.makedirs(home, exist_ok=True)
    return tempfile.mkdtemp(prefix="staging-", dir=home)


def _publish(local: str, staging: str, target: str, path: str, *, overwrite: bool,
             kind) -> None:
    if storage.exists(target):  # appeared meanwhile, or the one overwrite replaces
        _refuse_existing(target, path, overwrite=overwrite, kind=kind, meanwhile=True)
    old = sorted(transfer.remote_files(target)) if overwrite else []
    # A command ended by its storage deadline midway says what it leaves (an error raised
    # here is given the same account by the upload itself).
    note = storage_deadline.note(_partly_uploaded(path, target, old))
    try:
        remote_publish.Upload(local, target, path, staging=staging, kind_name=kind.name,
                              old=old).run(_records(local))
    finally:
        storage_deadline.drop(note)


def _partly_uploaded(path: str, target: str, old: list) -> str:
    """What an upload ended midway leaves, for the line that ends the command."""
    if old:
        return (f"{path} is partly replaced and marked unfinished (the old output's records "
                "removed): run the command again with --overwrite")
    return (f"{path} is partly uploaded and marked unfinished (nothing reads it as an output): "
            f"remove it (gcloud storage rm -r {target}) or run the command again with --overwrite")


def _records(local: str) -> list[str]:
    if os.path.isfile(local):
        return []
    return sorted(os.path.relpath(os.path.join(root, name), local)
                  for root, _, names in os.walk(local) for name in names
                  if name.endswith(".json"))
