"""Outputs whose target is a URL (an export, an index, embeddings on gs://): output_dir's promise,
kept as far as an object store allows.

The output is built in a local staging copy (removed whatever stops the command), then uploaded
object by object, the JSON records last: readers identify an output by its record (bertjax.json,
manifest.json), so one interrupted upload is not taken for a whole output. What is checked
before any work, as locally: an existing target is refused without overwrite; with overwrite,
only an output of the same kind is replaced; never an input. A bucket has no rename, so two
commands writing one URL at once are caught only when the second finishes and finds the first's
record (the final check), and an overwritten output is replaced object by object, stale objects
removed after the new ones are all in place.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import IO, Iterable, Iterator

from bertjax.core import storage, storage_deadline, transfer
from bertjax.core.errors import UserError
from bertjax.core.packaged import cache_dir


def check_target(path: str, *, overwrite: bool, kind, sources: Iterable[str | None]) -> str:
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
        if not overwrite:
            raise UserError(f"{path} already exists; choose a new output or pass --overwrite")
        if not _holds(target, kind):
            raise UserError(f"{path} is not a {kind.name}; --overwrite replaces only a "
                            f"{kind.name}: choose another output")
    elif not storage.isdir(storage.bucket(target)):
        raise UserError(f"cannot write {path}: the bucket {storage.bucket(target)} does not "
                        "exist")
    return target


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
        yield staging
        _publish(staging, target, path, overwrite=overwrite, kind=kind)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def staged_file(path: str, *, overwrite: bool, kind, sources: Iterable[str | None] = (),
                mode: str = "wb") -> Iterator[IO]:
    target = check_target(path, overwrite=overwrite, kind=kind, sources=sources)
    staging = _staging_directory()
    try:
        local = os.path.join(staging, storage.basename(target))
        with open(local, mode, encoding=None if "b" in mode else "utf-8") as f:
            yield f
        _publish(local, target, path, overwrite=overwrite, kind=kind)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _staging_directory() -> str:
    home = os.path.join(cache_dir(), "outputs")
    os.makedirs(home, exist_ok=True)
    return tempfile.mkdtemp(prefix="staging-", dir=home)


def _publish(local: str, target: str, path: str, *, overwrite: bool, kind) -> None:
    if storage.exists(target):  # appeared meanwhile, or the one overwrite replaces
        if not overwrite:
            raise UserError(f"{path} already exists (another command wrote it meanwhile); "
                            "choose a new output or pass --overwrite")
        if not _holds(target, kind):
            raise UserError(f"{path} is not a {kind.name}; --overwrite replaces only a "
                            f"{kind.name}: choose another output")
    old = set(transfer.remote_files(target)) if overwrite and kind.directory else set()
    records = _records(local)
    with storage_deadline.unfinished(_partly_uploaded(path, target, old)):
        uploaded = transfer.upload_tree(local, target, last=records)
    stale = old - set(uploaded)
    for name in sorted(stale):
        storage.remove(storage.join(target, name))


def _partly_uploaded(path: str, target: str, old: set) -> str:
    """What an upload ended midway leaves, for the line that ends the command."""
    if old:
        return (f"{path} is partly replaced (the old output's objects and some new ones): "
                "run the command again with --overwrite")
    return (f"{path} is partly uploaded, without its record (nothing reads it as an output): "
            f"remove it (gcloud storage rm -r {target}) or run the command again with --overwrite")


def _records(local: str) -> list[str]:
    if os.path.isfile(local):
        return []
    return sorted(os.path.relpath(os.path.join(root, name), local)
                  for root, _, names in os.walk(local) for name in names
                  if name.endswith(".json"))
