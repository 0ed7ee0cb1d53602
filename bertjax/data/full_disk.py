"""A full disk while writing prepared data: one line for the user, not a traceback."""

from __future__ import annotations

import contextlib
import errno
import shutil
from typing import Iterator

from bertjax.core.errors import UserError
from bertjax.core.output_dir import readable_size


@contextlib.contextmanager
def full_disk_reported(output_dir: str) -> Iterator[None]:
    """A full disk is the user's to fix, not a traceback: one line with the path and the space
    left. Every write is atomic, so the complete shards stay and a rerun finishes the rest."""
    try:
        yield
    except OSError as e:
        if e.errno not in (errno.ENOSPC, errno.EDQUOT):
            raise
        try:
            free = f"{readable_size(shutil.disk_usage(output_dir).free)} free there"
        except OSError:
            free = "free space unknown"
        raise UserError(f"no space left on the device writing the prepared corpus {output_dir} "
                        f"({free}); its complete shards are kept: free some space and run the "
                        "same command again to finish") from None
