"""A rename that never replaces: the final step of an output written without overwrite.

Checking that the target is absent and then renaming leaves a window in which another command
can finish the same output, which the rename would then silently replace (or, for a directory,
fail on only when the other's is not empty). Linux's renameat2 with RENAME_NOREPLACE makes the
check and the rename one step. Where it is missing (not glibc, an old kernel, a file system that
does not support the flag), a file is published with link(), which also fails on an existing
name, and a directory with a check-then-rename, the best POSIX offers.
"""

from __future__ import annotations

import ctypes
import errno
import os

_AT_FDCWD = -100
_RENAME_NOREPLACE = 1
try:
    _libc = ctypes.CDLL(None, use_errno=True)
    _renameat2 = _libc.renameat2
    _renameat2.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p,
                           ctypes.c_uint]
except (OSError, AttributeError):
    _renameat2 = None


def rename_no_replace(source: str, target: str) -> None:
    """Renames `source` to `target`; FileExistsError if `target` exists (even if empty)."""
    if _renameat2 is not None:
        if _renameat2(_AT_FDCWD, os.fsencode(source), _AT_FDCWD, os.fsencode(target),
                      _RENAME_NOREPLACE) == 0:
            return
        code = ctypes.get_errno()
        if code == errno.EEXIST:
            raise FileExistsError(code, os.strerror(code), target)
        if code not in (errno.ENOSYS, errno.EINVAL, errno.ENOTSUP):
            raise OSError(code, os.strerror(code), target)
    _portable_rename_no_replace(source, target)


def _portable_rename_no_replace(source: str, target: str) -> None:
    if os.path.isdir(source):
        if os.path.lexists(target):
            raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), target)
        os.rename(source, target)
        return
    os.link(source, target)
    os.unlink(source)
