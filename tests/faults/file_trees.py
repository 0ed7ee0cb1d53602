"""What is on disk under a directory, as {relative path: md5}, to show that a refused command left
it byte for byte as it was."""

import hashlib
import os


def md5s(root: str) -> dict[str, str]:
    """Every file under root (or root itself) with its md5."""
    paths = [root] if os.path.isfile(root) else [
        os.path.join(d, n) for d, _, names in os.walk(root) for n in names]
    result = {}
    for path in sorted(paths):
        with open(path, "rb") as f:
            result[os.path.relpath(path, root) if path != root else "."] = \
                hashlib.md5(f.read()).hexdigest()
    return result
