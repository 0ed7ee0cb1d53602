"""What a URL names (`gs://bucket/run/x`: its scheme, bucket and path) and whether any store could
serve it as given, decided without a request. `bertjax.core.storage` uses these and offers them
under its own name; the requests are its.
"""

from __future__ import annotations

import os
import posixpath
import re

from bertjax.core.errors import UserError

_URL = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")
# Google's schemes need the gcs extra; other schemes: the module fsspec needs, what to install
GCS_SCHEMES = ("gs", "gcs")
BACKENDS = {"s3": ("s3fs", "pip install s3fs"),
            "az": ("adlfs", "pip install adlfs"),
            "abfs": ("adlfs", "pip install adlfs")}
# A bucket name by Google's rules: 3 to 222 characters, dot-separated parts of at most 63.
_GCS_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
MAX_OBJECT_NAME_BYTES = 1024
_QUERY = re.compile(r"\?[A-Za-z_]+=")  # a lone `?` is a glob's wildcard in an input


def is_url(path: object) -> bool:
    return isinstance(path, str) and _URL.match(path) is not None


def scheme(url: str) -> str:
    match = _URL.match(url)
    return match.group(1).lower() if match else ""


def absolute(path: str) -> str:
    """A URL as given (less a trailing slash, but never its scheme's), a local path made
    absolute."""
    if not is_url(path):
        return os.path.abspath(path)
    stripped = path.rstrip("/")
    return stripped if is_url(stripped) else path


def join(base: str, *parts: str) -> str:
    return posixpath.join(base, *parts) if is_url(base) else os.path.join(base, *parts)


def parent(path: str) -> str:
    return posixpath.dirname(path.rstrip("/")) if is_url(path) else os.path.dirname(path)


def basename(path: str) -> str:
    return posixpath.basename(path.rstrip("/")) if is_url(path) else os.path.basename(path)


def bucket(url: str) -> str:
    """`gs://bucket` of `gs://bucket/run/x`."""
    name = url[len(scheme(url)) + 3:].split("/", 1)[0]
    if not name:
        raise UserError(f"{url} names no bucket: write {scheme(url)}://BUCKET/PATH")
    return f"{scheme(url)}://{name}"


def check_url(url: str) -> None:
    """Refuses, before any request, a URL no store could serve as given, in one line naming it:
    a scheme bertjax has no backend for (file:// included: a local path is given as one), no
    bucket or (gs://) an impossible bucket name, whitespace or control characters (a quoting
    slip: they would make objects no one can name in a shell), `#` (a URL fragment) or a query
    (`?generation=`, which the backend reads as a request parameter), `.` or `..`
    segments (an object store keeps them literally rather than resolving them), or an object
    name longer than a bucket allows."""
    name = scheme(url)
    if name == "file":
        raise UserError(f"{url}: give the local path {url[len('file://'):]} rather than a "
                        "file:// URL")
    if name not in GCS_SCHEMES + tuple(BACKENDS):
        raise UserError(f"{url}: {name}:// is not a storage scheme bertjax can use "
                        "(gs://, s3:// or a local path)")
    if any(c.isspace() or not c.isprintable() for c in url):
        raise UserError(f"{url!r} contains whitespace or a control character, which bertjax "
                        "does not accept in a URL")
    root = bucket(url)
    bucket_name = root[len(name) + 3:]
    if name in GCS_SCHEMES and not (_GCS_BUCKET.match(bucket_name) and
                                    all(len(part) <= 63 for part in bucket_name.split("."))):
        raise UserError(f"{url}: {bucket_name!r} is not a valid bucket name (3 to 63 "
                        "lowercase letters, digits, '-', '_' and '.', starting and ending with "
                        "a letter or digit)")
    key = url[len(root) + 1:]
    if "#" in key:
        raise UserError(f"{url}: '#' starts a URL fragment; bertjax does not accept it in a URL")
    if _QUERY.search(key):  # gcsfs reads `x?generation=5` as object x at version 5
        raise UserError(f"{url}: '?NAME=' would be read as a request parameter, not as part of "
                        "the object's name; bertjax does not accept it in a URL")
    if any(part in (".", "..") for part in key.split("/")):
        raise UserError(f"{url}: '.' and '..' are not resolved in a bucket (an object would be "
                        "named by them); write the path without them")
    if len(key.encode()) > MAX_OBJECT_NAME_BYTES:
        raise UserError(f"{url}: an object name of {len(key.encode())} bytes, more than the "
                        f"{MAX_OBJECT_NAME_BYTES} a bucket allows")
