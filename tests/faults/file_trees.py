"""What is on disk under a directory, as {relative path: md5}, to show that a refused command left
it byte for byte as it was.

The catalog hashes the shared inputs (a finished run's checkpoints, a prepared corpus, exports)
before and after each of its cases; re-reading files nothing had touched would be much of the
catalog's run. A file's md5 is therefore kept with its inode, size, mtime and ctime, and reused
while all four are unchanged: the kernel moves ctime on every write, truncation or rename onto
the path, and no process can set it back. A file changed within the last second is always re-read,
as timestamps advance in clock ticks, not nanoseconds.
"""

import hashlib
import os
import time

SETTLED_SECONDS = 1.0
_known: dict[str, tuple[tuple, str]] = {}  # path -> (its stat when hashed, md5)


def _md5(path: str) -> str:
    st = os.stat(path)
    key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)
    settled = time.time_ns() - st.st_ctime_ns > SETTLED_SECONDS * 1e9
    known = _known.get(path)
    if settled and known is not None and known[0] == key:
        return known[1]
    with open(path, "rb") as f:
        digest = hashlib.md5(f.read()).hexdigest()
    if settled:
        _known[path] = (key, digest)
    return digest


def md5s(root: str) -> dict[str, str]:
    """Every file under root (or root itself) with its md5."""
    paths = [root] if os.path.isfile(root) else [
        os.path.join(d, n) for d, _, names in os.walk(root) for n in names]
    return {os.path.relpath(path, root) if path != root else ".": _md5(path)
            for path in sorted(paths)}
