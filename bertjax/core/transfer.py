"""Whole files and trees between a bucket and this host.

Inputs named by URL (a tokenizer, fine-tuning data, a prepared corpus, a model to load) are read
through a local copy: the readers memory-map shards and hand paths to tokenizers and Orbax, which
need files. The copy lives in the cache ($BERTJAX_CACHE/storage), keyed by the URL, and is
fetched again only when an object's size or generation (its etag where the store has no
generation) changed, so every host of a pod slice reads the bucket once per change. A copy is
built in a staging directory and renamed into place, so a killed download is never mistaken for
a copy.

Outputs go the other way: `upload_tree` writes each file as a whole object, the file readers
look for first (a manifest, run.json) last.
"""

from __future__ import annotations

import base64
import contextlib
import fcntl
import hashlib
import json
import os
import posixpath
import shutil
import tempfile
from typing import Callable, Iterable

from bertjax.core import storage, storage_deadline
from bertjax.core.errors import UserError, name_copy
from bertjax.core.packaged import cache_dir

STATE_FILE = ".bertjax-remote.json"  # what a local copy was copied from (sizes, generations)


def remote_files(url: str) -> dict[str, dict]:
    """{path relative to url: {"size", "version"}} of every object at or under `url` ({} when
    nothing is there)."""
    fs, inner = storage.filesystem(url)
    with storage.reported(url, "list"):
        info = storage.object_info(fs, inner)
        if info is not None and info["type"] == "file":
            return {"": _entry(info)}
        found = fs.find(inner, detail=True, withdirs=False)
    prefix = inner.rstrip("/") + "/"
    return {name[len(prefix):]: _entry(info) for name, info in found.items()
            if name.startswith(prefix) and not name.endswith("/")}


def _entry(info: dict) -> dict:
    version = info.get("generation") or info.get("etag") or info.get("ETag") or \
        info.get("mtime") or info.get("updated") or ""
    entry = {"size": int(info.get("size") or 0), "version": str(version)}
    if info.get("md5Hash"):  # GCS's digest of the object: each copy is checked against it
        entry["md5"] = info["md5Hash"]
    return entry


def get_checked(fs, source: str, local: str, entry: dict) -> None:
    """Downloads one object, and again once when its bytes do not match the store's digest (or
    size); a second mismatch is an error, never a silently damaged copy."""
    for _ in range(2):
        storage_deadline.progress(entry["size"])
        fs.get_file(source, local)
        if _matches(local, entry):
            return
    raise UserError(f"the copy of {source} does not match the object's digest twice; the "
                    "storage or the network corrupts it")


def _matches(local: str, entry: dict) -> bool:
    if os.path.getsize(local) != entry["size"]:
        return False
    if "md5" not in entry:
        return True
    digest = hashlib.md5()
    with open(local, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return base64.b64encode(digest.digest()).decode() == entry["md5"]


def local_copy(url: str, *, skip: Callable[[str], bool] = lambda relative: False) -> str:
    """A local path holding what `url` holds (a file or a directory), less the relative paths
    `skip` names. A local path is returned as it is."""
    if not storage.is_url(url):
        return url
    url = storage.absolute(url)
    files = {name: entry for name, entry in remote_files(url).items() if not skip(name)}
    if not files:
        raise storage.not_found(url)
    home = os.path.join(cache_dir(), "storage",
                        hashlib.sha256(url.encode()).hexdigest()[:20])
    target = os.path.join(home, storage.basename(url) or "root")
    os.makedirs(home, exist_ok=True)
    with _locked(home):
        if _recorded(target) != files:
            _fetch(url, files, target, home)
    name_copy(target, url)
    return target


def _recorded(target: str) -> dict | None:
    record = os.path.join(os.path.dirname(target), STATE_FILE)
    try:
        with open(record) as f:
            return json.load(f) if os.path.exists(target) else None
    except (OSError, ValueError):
        return None


def _fetch(url: str, files: dict[str, dict], target: str, home: str) -> None:
    staging = tempfile.mkdtemp(prefix=".fetch-", dir=home)
    try:
        fs, inner = storage.filesystem(url)
        with storage.reported(url, "read"):
            for relative in files:
                source = posixpath.join(inner, relative) if relative else inner
                local = os.path.join(staging, "copy", relative) if relative else \
                    os.path.join(staging, "copy")
                os.makedirs(os.path.dirname(local), exist_ok=True)
                get_checked(fs, source, local, files[relative])
        storage.remove(target)
        os.rename(os.path.join(staging, "copy"), target)
        with open(os.path.join(home, STATE_FILE), "w") as f:
            json.dump(files, f)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


@contextlib.contextmanager
def _locked(directory: str):
    """Two processes of one host (a pod's workers) fetching the same URL: one fetches."""
    with open(os.path.join(directory, ".lock"), "w") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def upload_tree(local: str, url: str, *, last: Iterable[str] = (),
                only: Callable[[str], bool] = lambda relative: True,
                before_each: Callable[[list[str]], None] = lambda uploaded: None) -> list[str]:
    """Uploads every file under `local` (or the file `local`) to `url`, each as a whole object;
    the relative paths in `last` after all others. `before_each` is called with the relative
    paths uploaded so far before each object (and once at the end): the place to stop between
    two objects. Returns the relative paths uploaded."""
    if os.path.isfile(local):
        relatives = [""]
    else:
        relatives = sorted(os.path.relpath(os.path.join(root, name), local)
                           for root, _, names in os.walk(local) for name in names)
    relatives = [r for r in relatives if only(r)]
    ordered = [r for r in relatives if r not in set(last)] + [r for r in last if r in relatives]
    fs, inner = storage.filesystem(url)
    with storage.reported(url, "write"):
        for index, relative in enumerate(ordered):
            before_each(ordered[:index])
            source = os.path.join(local, relative) if relative else local
            storage_deadline.progress(os.path.getsize(source))
            fs.put_file(source, posixpath.join(inner, relative) if relative else inner)
    before_each(ordered)
    return ordered


def local_inputs(specs: Iterable[str]) -> list[str]:
    """Input specs (files, directories, globs) with every URL among them replaced by local
    copies: a glob by the copies of what it matches, in order. Other specs pass unchanged."""
    local = []
    for spec in specs:
        if not storage.is_url(spec):
            local.append(spec)
            continue
        if not any(c in spec for c in "*?["):
            local.append(local_copy(spec))
            continue
        fs, inner = storage.filesystem(spec)
        with storage.reported(spec, "list"):
            matches = sorted(fs.glob(inner))
        if not matches:
            raise storage.not_found(spec)
        prefix = storage.scheme(spec) + "://"
        local += [local_copy(prefix + match) for match in matches]
    return local


def working_copy(url: str) -> str:
    """A local directory to build what will be uploaded to `url` in, kept between attempts (a
    preparation interrupted on this host resumes where it stopped)."""
    directory = os.path.join(cache_dir(), "building",
                             hashlib.sha256(storage.absolute(url).encode()).hexdigest()[:20])
    os.makedirs(directory, exist_ok=True)
    return directory
