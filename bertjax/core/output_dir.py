"""Export targets that appear whole or not at all.

Everything is written into a hidden staging directory beside the target and renamed into place at
the end, so a failure (bad input found late, a full disk, Ctrl-C) leaves no half-written export,
and an existing target is only replaced, never mixed with new files, when the caller allows it.
The export gets ordinary permissions (the umask's), not the staging directory's private ones.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from typing import Iterator

from bertjax.core.errors import UserError
from bertjax.core.file_modes import publish


def check_target(directory: str, *, overwrite: bool, sources: tuple[str, ...] = ()) -> str:
    """The absolute target path, refused (before any work) when it exists and `overwrite` is not
    set, when it is not a directory, or when replacing it would delete one of `sources`."""
    target = os.path.abspath(directory)
    if os.path.exists(target):
        if not overwrite:
            raise UserError(f"{directory} already exists; choose a new output or pass --overwrite")
        if not os.path.isdir(target):
            raise UserError(f"{directory} exists and is not a directory")
    real = os.path.realpath(target)
    for source in sources:
        source_real = os.path.realpath(source)
        if source_real == real or source_real.startswith(real + os.sep):
            raise UserError(f"the output {directory} would replace the input {source}; "
                            "choose another output")
    return target


@contextlib.contextmanager
def staged(directory: str, *, overwrite: bool) -> Iterator[str]:
    """Yields an empty staging directory that becomes `directory` when the block succeeds."""
    target = check_target(directory, overwrite=overwrite)
    parent = os.path.dirname(target)
    try:
        os.makedirs(parent, exist_ok=True)
        staging = tempfile.mkdtemp(prefix=f".{os.path.basename(target)}.tmp-", dir=parent)
    except OSError as e:
        raise UserError(f"cannot write {directory}: {e.strerror or e}") from None
    try:
        yield staging
        publish(staging)
        _move_into_place(staging, target)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def _move_into_place(staging: str, target: str) -> None:
    if not os.path.exists(target):
        os.rename(staging, target)
        return
    # The old export stays whole until the new one is in place.
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
