"""Files written whole or not at all: readers, and a run killed mid-write, never see half a file.

The content goes to a temporary file in the target's directory (so that the final rename stays
on one file system), is flushed to disk, and replaces the target with `os.replace`, which POSIX
makes atomic. The file gets the permissions a plain `open` would give it (0666 less the umask),
not the 0600 of a temporary file.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from typing import IO, Any, Iterator

from bertjax.core.file_modes import current_umask


@contextlib.contextmanager
def replacing(path: str, mode: str = "w", encoding: str | None = "utf-8") -> Iterator[IO]:
    """A file to write `path`'s new content to; it replaces `path` when the block ends without
    an exception, and is deleted otherwise. The directory must exist."""
    directory = os.path.dirname(os.path.abspath(path))
    handle, tmp = tempfile.mkstemp(prefix=f".{os.path.basename(path)}.tmp-", dir=directory)
    try:
        with os.fdopen(handle, mode, encoding=None if "b" in mode else encoding) as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o666 & ~current_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def write_text(path: str, text: str) -> None:
    with replacing(path) as f:
        f.write(text)


def write_json(path: str, value: Any, *, sort_keys: bool = False) -> None:
    """`value` as indented JSON and a final newline."""
    write_text(path, json.dumps(value, indent=2, sort_keys=sort_keys) + "\n")
