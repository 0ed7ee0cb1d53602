"""Outputs (exports, indexes, embeddings, rankings) that appear whole or not at all, and only where
they may.

Everything is written into a hidden staging file or directory beside the target and moved into
place at the end, so a failure (bad input found late, a full disk, Ctrl-C, SIGTERM) leaves no
half-written output and removes the staging copy. The promise about what already exists:

- without overwrite, an existing target is refused before any work, and the final move cannot
  replace one that appeared meanwhile (two commands writing the same output at once: the second
  to finish is refused, the first's output stays);
- with overwrite, only an output of the same `Kind` is replaced (an index by an index, never a
  workdir by an index), and the old one stays whole until the new one is in place;
- never an input: a target that is, contains or lies inside one of the command's inputs is
  refused with or without overwrite.

The output gets ordinary permissions (the umask's), not the staging copy's private ones. A target
that is a URL (gs://...) is staged locally and uploaded (remote_output.py).
"""

from __future__ import annotations

import contextlib
import dataclasses
import errno
import os
import shutil
import tempfile
from typing import IO, Callable, Iterable, Iterator

from bertjax.core import remote_output, storage, termination
from bertjax.core.errors import UserError
from bertjax.core.file_modes import current_umask, publish
from bertjax.core.no_replace import rename_no_replace

FULL_DISK = (errno.ENOSPC, errno.EDQUOT)
NOT_WRITABLE = (errno.EROFS, errno.EACCES, errno.EPERM)
NEARLY_FULL = 64 * 1024


@dataclasses.dataclass(frozen=True)
class Kind:
    """What a command writes: `name` for messages ("retrieval index"), a directory or a file, and
    `holds(path)`: whether an existing path is an output of this kind, the only thing that
    overwrite may replace."""
    name: str
    directory: bool
    holds: Callable[[str], bool]


def check_target(path: str, *, overwrite: bool, kind: Kind,
                 sources: Iterable[str | None] = ()) -> str:
    """The absolute target path, refused (before any work) as the module docstring says."""
    if storage.is_url(path):
        return remote_output.check_target(path, overwrite=overwrite, kind=kind, sources=sources)
    target = os.path.abspath(path)
    _refuse_inputs(path, target, sources)
    if os.path.lexists(target):
        if not overwrite:
            raise UserError(f"{path} already exists; choose a new output or pass --overwrite")
        if os.path.isdir(target) != kind.directory or not kind.holds(target):
            raise UserError(f"{path} is not a {kind.name}; --overwrite replaces only a "
                            f"{kind.name}: choose another output")
    elif not kind.directory and not os.path.isdir(os.path.dirname(target)):
        raise UserError(f"cannot write {path}: {os.path.dirname(target)} is not an existing "
                        "directory")
    return target


def check_space(path: str, needed: int) -> None:
    """Refuses, before any byte is written, an output that cannot fit where it goes (an estimate
    of `needed` bytes; a full disk found later is reported too, this only saves the work)."""
    if storage.is_url(path):
        return  # a bucket has no free space to check
    parent = os.path.dirname(os.path.abspath(path))
    while parent and not os.path.isdir(parent):
        parent = os.path.dirname(parent)
    try:
        free = shutil.disk_usage(parent).free
    except OSError:
        return
    if needed > free:
        raise UserError(f"{path} needs about {readable_size(needed)} but the device has "
                        f"{readable_size(free)} free; free some space or write it elsewhere")


def _refuse_inputs(path: str, target: str, sources: Iterable[str | None]) -> None:
    real = os.path.realpath(target)
    for source in sources:
        if not source or "://" in source or source.startswith("packaged:"):
            continue
        source_real = os.path.realpath(source)
        if source_real == real or source_real.startswith(real + os.sep):
            raise UserError(f"the output {path} would replace the input {source}; "
                            "choose another output")
        if real.startswith(source_real + os.sep) and os.path.isdir(source_real):
            raise UserError(f"the output {path} would be written inside the input {source}; "
                            "choose another output")


@contextlib.contextmanager
def staged(path: str, *, overwrite: bool, kind: Kind,
           sources: Iterable[str | None] = ()) -> Iterator[str]:
    """Yields an empty staging directory that becomes `path` when the block succeeds."""
    if storage.is_url(path):
        with remote_output.staged(path, overwrite=overwrite, kind=kind, sources=sources) as local:
            yield local
        return
    target = check_target(path, overwrite=overwrite, kind=kind, sources=sources)
    parent = os.path.dirname(target)
    with _write_errors_reported(path, parent):
        os.makedirs(parent, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.tmp-", dir=parent)
    with _removed_on_failure(staging, path, parent):
        with _sigterm_removes(staging):
            yield staging
            publish(staging)
        _move_into_place(staging, target, path, overwrite=overwrite, kind=kind)


@contextlib.contextmanager
def staged_file(path: str, *, overwrite: bool, kind: Kind, sources: Iterable[str | None] = (),
                mode: str = "wb") -> Iterator[IO]:
    """Yields an open staging file that becomes `path` when the block succeeds."""
    if storage.is_url(path):
        with remote_output.staged_file(path, overwrite=overwrite, kind=kind, sources=sources,
                                       mode=mode) as f:
            yield f
        return
    target = check_target(path, overwrite=overwrite, kind=kind, sources=sources)
    parent = os.path.dirname(target)
    with _write_errors_reported(path, parent):
        handle, staging = tempfile.mkstemp(prefix=f".{os.path.basename(target)}.tmp-",
                                           dir=parent)
    with _removed_on_failure(staging, path, parent):
        with _sigterm_removes(staging), \
                os.fdopen(handle, mode, encoding=None if "b" in mode else "utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(staging, 0o666 & ~current_umask())
        _move_into_place(staging, target, path, overwrite=overwrite, kind=kind)


@contextlib.contextmanager
def _removed_on_failure(staging: str, path: str, parent: str) -> Iterator[None]:
    """The staging copy is removed whatever stops the block: an error, a full disk, SIGTERM."""
    try:
        with _write_errors_reported(path, parent):
            yield
    except BaseException:
        _remove(staging)
        raise


def _remove(staging: str) -> None:
    if os.path.isdir(staging):
        shutil.rmtree(staging, ignore_errors=True)
    else:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(staging)


def _sigterm_removes(staging: str):
    """While an output is staged, SIGTERM removes the staging copy and ends the process with
    EXIT_TERMINATED and one line (bertjax.core.termination). The final move is outside: SIGTERM
    then ends the process as usual."""

    def clean_up() -> str:
        _remove(staging)
        return ("stopped by SIGTERM before the output was complete; the unfinished output was "
                "removed and nothing older was changed")

    return termination.ended_by_sigterm(clean_up)


@contextlib.contextmanager
def _write_errors_reported(path: str, parent: str) -> Iterator[None]:
    """A full disk or a directory that cannot be written is the user's to fix: one line naming
    the output and the space left, not a traceback."""
    try:
        yield
    except OSError as e:
        if e.errno in FULL_DISK or (e.errno is None and _nearly_full(parent)):
            raise UserError(f"no space left on the device writing {path} ({_free(parent)}); "
                            "nothing was written: free some space and run the command again"
                            ) from None
        if e.errno in NOT_WRITABLE and _under(e.filename, parent):
            raise UserError(f"cannot write {path}: {e.strerror} ({e.filename or parent})"
                            ) from None
        raise


def _nearly_full(directory: str) -> bool:
    """numpy reports a short write ("N requested and M written") without an errno: a disk with
    less than a page or so left is the reason."""
    try:
        return shutil.disk_usage(directory).free < NEARLY_FULL
    except OSError:
        return False


def _under(filename, directory: str) -> bool:
    """Whether an error is about the output (not, say, an input read inside the block)."""
    if filename is None:
        return True
    return os.path.abspath(str(filename)).startswith(os.path.abspath(directory) + os.sep) or \
        os.path.abspath(str(filename)) == os.path.abspath(directory)


def _free(directory: str) -> str:
    try:
        return f"{readable_size(shutil.disk_usage(directory).free)} free there"
    except OSError:
        return "free space unknown"


def readable_size(count: float) -> str:
    for unit in ("bytes", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            return f"{int(count)} bytes" if unit == "bytes" else f"{count:.1f} {unit}"
        count /= 1024
    return f"{count:.1f} TiB"


def _move_into_place(staging: str, target: str, path: str, *, overwrite: bool,
                     kind: Kind) -> None:
    if not overwrite:
        try:
            rename_no_replace(staging, target)
        except FileExistsError:
            raise UserError(f"{path} already exists (another command wrote it meanwhile); "
                            "choose a new output or pass --overwrite") from None
        return
    # Checked again at the end: what appeared meanwhile is replaced only if of the same kind.
    check_target(path, overwrite=True, kind=kind)
    if not kind.directory:
        os.replace(staging, target)
        return
    if not os.path.exists(target):
        os.rename(staging, target)
        return
    # The old output stays whole until the new one is in place.
    retired = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.old-",
                               dir=os.path.dirname(target))
    old = os.path.join(retired, "old")
    os.rename(target, old)
    try:
        os.rename(staging, target)
    except OSError:
        os.rename(old, target)
        raise
    finally:
        shutil.rmtree(retired, ignore_errors=True)
