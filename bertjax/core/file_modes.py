"""Outputs staged through `tempfile` get the permissions of ordinary files.

`tempfile` creates private entries (0600 files, 0700 directories) so that nobody can race into
them; an output renamed into place from there would keep those modes, unlike everything else the
user creates. `publish` gives a staged file or tree what `open` and `mkdir` would have given it:
0666 (0777 for directories and executables) less the process's umask.
"""

from __future__ import annotations

import os
import stat


def current_umask() -> int:
    # /proc reads it without changing it (os.umask can only read by setting, racing other threads).
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def default_mode(path: str, umask: int | None = None) -> int:
    """The mode `open` or `mkdir` would have created `path` with."""
    umask = current_umask() if umask is None else umask
    mode = os.lstat(path).st_mode
    executable = stat.S_ISDIR(mode) or mode & 0o111
    return (0o777 if executable else 0o666) & ~umask


def publish(path: str) -> None:
    """Gives `path` (a file, or a directory and everything below it) default permissions."""
    umask = current_umask()
    entries = [path]
    if os.path.isdir(path) and not os.path.islink(path):
        for root, dirs, files in os.walk(path):
            entries += [os.path.join(root, name) for name in dirs + files]
    for entry in entries:
        if not os.path.islink(entry):
            os.chmod(entry, default_mode(entry, umask))
