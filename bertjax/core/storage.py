"""Paths that may name objects in a bucket (`gs://bucket/run`, `s3://...`) as well as local files.

Local paths keep the file system's own guarantees (atomic renames, flock) and never pass through
here for anything but `is_url`. A URL is served by fsspec and the backend installed for its scheme
(gcsfs for gs://): fsspec rather than etils.epath because the things bertjax needs from a bucket
beyond reading and writing (a create-only-if-absent write conditioned on the object's
generation, bounded request timeouts, the backend's own error types) are fsspec's filesystem
methods and arguments, which epath hides. Orbax (checkpoints) goes through epath and TensorStore
itself; both accept the same URLs.

An object store has no rename and no partial write: every object is written whole (fsspec
uploads it in one request or as a resumable upload that becomes visible only when complete), so a
reader sees an old object or the new one, never half of one. Directories are prefixes; a tree is
"published" by uploading its files with the one file readers check for last.

Errors from the backend (a bucket that does not exist, no credentials, a server that stops
answering) become one-line UserErrors naming the URL, in seconds: every request is bounded by
BERTJAX_STORAGE_TIMEOUT seconds (default 30) and the backend's few retries, and in a command
every call as a whole, retries included (storage_deadline.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import math
import os
import posixpath
import re
import shutil
from typing import Iterator

# gcsfs otherwise asks each bucket over gRPC whether it is a zonal / hierarchical one before the
# first request (logging a fallback on every operation against anything but Google's own
# endpoint); bertjax uses neither kind's extra features. Read when gcsfs is imported.
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")

import fsspec  # noqa: E402 (after the setting above)
import fsspec.exceptions  # noqa: E402

from bertjax.core import extras, storage_deadline  # noqa: E402
# What a URL names, and whether it can name anything: storage's own vocabulary, used through it.
from bertjax.core.storage_urls import (  # noqa: E402,F401
    BACKENDS, GCS_SCHEMES, absolute, basename, bucket, check_url, is_url, join, parent, scheme)
from bertjax.core.atomic_files import replacing  # noqa: E402
from bertjax.core.errors import UserError  # noqa: E402

DEFAULT_TIMEOUT_S = 30.0
# Buckets whose server let a request of this process time out. A run failing because of that would
# otherwise wait out the timeout again for each request of its clean-up (see answered_so_far).
_UNANSWERING: set[str] = set()


def check_output_url(url: str, what: str = "an output") -> None:
    """check_url, a bucket's root refused as the place for `what` (a workdir, a prepared corpus:
    the bucket's other objects would be taken for part of it, or replaced by it), and a bucket
    that does not exist (one request), before any work."""
    filesystem(url)  # check_url, and a backend that is not installed, named with `url`
    root = bucket(url)
    if absolute(url) == absolute(root):
        raise UserError(f"cannot write {url}: a bucket's root is no place for {what}; name a "
                        f"path inside it, e.g. {root}/NAME")
    if not isdir(root):
        create = " (create it: gcloud storage buckets create ...)" if scheme(url) in GCS_SCHEMES \
            else ""
        raise UserError(f"cannot write {url}: the bucket {root} does not exist{create}")


def timeout_seconds() -> float:
    raw = os.environ.get("BERTJAX_STORAGE_TIMEOUT", "")
    if not raw:
        return DEFAULT_TIMEOUT_S
    try:
        seconds = float(raw)
    except ValueError:
        seconds = math.nan
    if not (math.isfinite(seconds) and seconds > 0):  # nan, inf, 0 and less bound nothing
        raise UserError(f"BERTJAX_STORAGE_TIMEOUT={raw!r} must be a positive, finite number of "
                        "seconds")
    return seconds


def filesystem(url: str):
    """(fsspec filesystem, the URL as that filesystem names it); a scheme with no backend
    installed is one line naming what to install, and gs:// without credentials one line
    saying how to get them."""
    name = scheme(url)
    check_url(url)  # a URL no store could serve is refused before any request
    if name in GCS_SCHEMES:
        extras.require("gcsfs", "gcs", f"{url}: a {name}:// path")
        bound_gcs_requests()
        _check_google_credentials()
    try:
        return fsspec.core.url_to_fs(url)
    except ImportError:
        module, install = BACKENDS.get(name, (name, f"an fsspec backend for {name}://"))
        raise UserError(f"{url}: paths starting {name}:// need the {module} package, which is "
                        f"not installed: {install}") from None
    except ValueError as e:
        if "protocol" in str(e).lower():
            raise UserError(f"{url}: {name}:// is not a storage scheme bertjax can use "
                            "(gs://, s3:// or a local path)") from None
        raise


def bound_gcs_requests() -> None:
    """Every gcsfs request, ours and Orbax's (through etils), gives up after the timeout: a
    server that stops answering is then an error, not a hang (gcsfs waits forever by default)."""
    options = fsspec.config.conf.setdefault("gs", {})
    options.setdefault("requests_timeout", timeout_seconds())
    # Another process (a run, another host) changes what is there: never answer from a listing
    # cached earlier.
    options.setdefault("use_listings_cache", False)
    emulator = os.environ.get("STORAGE_EMULATOR_HOST", "")
    if emulator:
        # gcsfs sends every request there: a value without a port names no server
        if not re.fullmatch(r"(https?://)?[\w.-]+:\d{1,5}/?", emulator):
            raise UserError(f"STORAGE_EMULATOR_HOST={emulator!r} must be [http://]host:port")
        options.setdefault("token", "anon")  # an emulator takes no credentials


@functools.lru_cache(maxsize=1)
def _check_google_credentials() -> None:
    """Without credentials gcsfs falls back to anonymous access and fails only after its retries
    (half a minute), with a DNS or 401 error that does not say why; asked once, up front."""
    if os.environ.get("STORAGE_EMULATOR_HOST"):
        return
    try:
        # deferred: only gs:// paths need it, and it comes with gcsfs (required above)
        import google.auth
        from google.auth.exceptions import DefaultCredentialsError
    except ImportError:
        return  # gcsfs itself reports what is missing
    auth_log = logging.getLogger("google.auth")
    level = auth_log.level
    auth_log.setLevel(logging.ERROR)  # its warning about the absent metadata server says less
    try:
        google.auth.default()
    except DefaultCredentialsError:
        raise UserError("gs:// paths need Google Cloud credentials and none were found: run "
                        "`gcloud auth application-default login` or set "
                        "GOOGLE_APPLICATION_CREDENTIALS") from None
    finally:
        auth_log.setLevel(level)


@contextlib.contextmanager
def reported(url: str, doing: str) -> Iterator[None]:
    """The backend's errors while `doing` something with `url`, as one line (UserError); in a
    command, the whole of it bounded (storage_deadline)."""
    try:
        with storage_deadline.bounded(url, doing):
            yield
    except UserError:
        raise
    except FileNotFoundError as e:
        raise UserError(f"cannot {doing} {url}: {_missing(url, e)}") from None
    except PermissionError as e:
        raise UserError(f"cannot {doing} {url}: access denied ({_first_line(e)}); check the "
                        "credentials (gcloud auth application-default login)") from None
    except (TimeoutError, asyncio.TimeoutError, fsspec.exceptions.FSTimeoutError):
        mark_unanswering(url)
        raise UserError(f"cannot {doing} {url}: the storage server did not answer within "
                        f"{timeout_seconds():.0f}s (BERTJAX_STORAGE_TIMEOUT)") from None
    except (ConnectionError, OSError) as e:
        if isinstance(e, ConnectionRefusedError) or type(e).__name__ == "ClientConnectorError":
            mark_unanswering(url)  # nothing listens there: a server gone, not a hiccup
        raise UserError(f"cannot {doing} {url}: {_first_line(e)}") from None
    except Exception as e:  # the backends' own error classes (HttpError, auth errors, aiohttp)
        if _is_credentials_error(e):
            raise UserError(f"cannot {doing} {url}: no Google Cloud credentials found (run "
                            "`gcloud auth application-default login` or set "
                            "GOOGLE_APPLICATION_CREDENTIALS)") from None
        if type(e).__module__.split(".")[0] in ("gcsfs", "aiohttp", "google", "s3fs",
                                                 "botocore", "fsspec", "asyncio"):
            raise UserError(f"cannot {doing} {url}: {type(e).__name__}: "
                            f"{_first_line(e) or 'no answer from the storage server'}") from None
        raise


def mark_unanswering(url: str) -> None:
    """A request to the bucket of `url` failed for want of an answer (see answered_so_far)."""
    if is_url(url):
        _UNANSWERING.add(bucket(url))


def unanswering() -> frozenset[str]:
    """The buckets that have stopped answering this process's requests."""
    return frozenset(_UNANSWERING)


def answered_so_far(url: str) -> bool:
    """False once a request of this process to the bucket of `url` has timed out: a failed run
    then skips the clean-up requests it would otherwise make (each would wait out the timeout)."""
    return bucket(url) not in _UNANSWERING


def not_found(url: str) -> UserError:
    """The error for a URL with nothing behind it, saying whether its bucket exists."""
    return UserError(f"{url} does not exist ({_missing(url, None)})")


def _missing(url: str, error: Exception | None) -> str:
    fs, _ = filesystem(url)
    try:
        bucket_exists = fs.exists(bucket(url))
    except Exception:
        bucket_exists = True  # cannot tell: report the object
    if not bucket_exists:
        return f"the bucket {bucket(url)} does not exist"
    return "no such object or directory"


def _is_credentials_error(error: Exception) -> bool:
    names = {cls.__name__ for cls in type(error).__mro__}
    return bool(names & {"DefaultCredentialsError", "RefreshError", "TransportError"})


def _first_line(error: BaseException) -> str:
    text = str(error).strip() or type(error).__name__
    return text.splitlines()[0][:300]


# ---- operations on a path that is a URL or a local path ----

def exists(path: str) -> bool:
    if not is_url(path):
        return os.path.exists(path)
    fs, inner = filesystem(path)
    with reported(path, "read"):
        return fs.exists(inner)


def isdir(path: str) -> bool:
    if not is_url(path):
        return os.path.isdir(path)
    fs, inner = filesystem(path)
    with reported(path, "read"):
        return object_kind(fs, inner) == "directory"


def isfile(path: str) -> bool:
    if not is_url(path):
        return os.path.isfile(path)
    fs, inner = filesystem(path)
    with reported(path, "read"):
        return object_kind(fs, inner) == "file"


def object_kind(fs, inner: str) -> str | None:
    """"file", "directory" or None (nothing there)."""
    info = object_info(fs, inner)
    return info["type"] if info is not None else None


def object_info(fs, inner: str) -> dict | None:
    """The backend's description of what is at `inner`, or None when nothing is. fsspec's own
    isdir/isfile answer False for any error, a request that timed out included: a listing that
    timed out would then look empty (and a failed run would remove a workdir whose checkpoints it
    could not list)."""
    try:
        return fs.info(inner)
    except FileNotFoundError:
        return None


def listdir(path: str) -> list[str]:
    """Names directly under `path` ([] where there is nothing)."""
    if not is_url(path):
        return os.listdir(path) if os.path.isdir(path) else []
    fs, inner = filesystem(path)
    with reported(path, "list"):
        if object_kind(fs, inner) != "directory":
            return []
        return sorted({posixpath.basename(p.rstrip("/")) for p in fs.ls(inner, detail=False)
                       if p.rstrip("/") != inner.rstrip("/")})


def read_bytes(path: str) -> bytes:
    if not is_url(path):
        with open(path, "rb") as f:
            return f.read()
    fs, inner = filesystem(path)
    with reported(path, "read"):
        return fs.cat_file(inner)


def write_bytes(path: str, data: bytes) -> None:
    """The whole object at once (a URL) or an atomic replace (a local file)."""
    if not is_url(path):
        with replacing(path, "wb") as f:
            f.write(data)
        return
    fs, inner = filesystem(path)
    with reported(path, "write"):
        fs.pipe_file(inner, data)


def remove(path: str) -> None:
    """A file or a whole tree; nothing where there is nothing."""
    if not is_url(path):
        if os.path.isdir(path):
            shutil.rmtree(path, ignore_errors=True)
        elif os.path.lexists(path):
            os.unlink(path)
        return
    fs, inner = filesystem(path)
    with reported(path, "remove"), contextlib.suppress(FileNotFoundError):
        fs.rm(inner, recursive=True)


def move(source: str, target: str) -> None:
    """A rename locally; on a bucket a copy of every object then the removal of the source (not
    atomic: used only to set aside checkpoints nothing reads meanwhile)."""
    if not is_url(source):
        os.rename(source, target)
        return
    fs, inner = filesystem(source)
    _, inner_target = filesystem(target)
    with reported(source, "move"):
        fs.mv(inner, inner_target, recursive=True)
