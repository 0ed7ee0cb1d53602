"""Files that ship inside Debian packages, fetched once and cached.

Several public-domain books ride inside Debian packages (Bibles as SWORD modules, novels as R
data sets). `apt-get download PKG=VERSION` fetches the .deb (nothing is installed, no root needed);
its ar container is read here in pure Python and the wanted members are taken out of data.tar.*
with tarfile. Versions are pinned (Debian 12's), so the cached files never change under a cache
key. Only a Debian machine whose apt sources carry those versions can fetch them: elsewhere
(Ubuntu, macOS, no apt-get) `fetch` raises `Unavailable`, which says why in a few words.

The cache is `packaged.cache_dir()/debian/<package>-<version>/`, filled atomically under the same
file lock as packaged.py's, so parallel test workers can share it.
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import tarfile
import tempfile

from bertjax.core import packaged
from bertjax.core.errors import UserError

# The files this project uses: (package=version, path inside the package; a folder ends in '/').
KJV_BIBLE = ("sword-text-kjv=14.3-1", "usr/share/sword/modules/texts/ztext/engKJV2006eb/")
WEB_BIBLE = ("sword-text-web=426.0-1", "usr/share/sword/modules/texts/ztext/engWEB2015eb/")
JANE_AUSTEN = ("r-cran-janeaustenr=1.0.0-1", "usr/lib/R/site-library/janeaustenr/data/")
MOBY_DICK = ("r-cran-tokenizers=0.3.0-1", "usr/lib/R/site-library/tokenizers/data/")

DOWNLOAD_TIMEOUT_S = 300  # a 4 MB package takes seconds; a hung mirror must not hang a test run
_AR_MAGIC = b"!<arch>\n"
_AR_HEADER = 60


class Unavailable(UserError):
    """A pinned package apt-get cannot fetch here; `reason` says why in a few words."""

    def __init__(self, package: str, reason: str):
        super().__init__(f"could not fetch {package} from the Debian archive: {reason}")
        self.package, self.reason = package, reason


def _download(package: str, into: str) -> str:
    """The .deb of `package` ("name=version"), downloaded into the folder `into`."""
    os.makedirs(into)
    os.chmod(into, 0o755)  # apt's unprivileged _apt user writes there when run as root
    try:
        result = subprocess.run(["apt-get", "download", "-q", package], cwd=into,
                                capture_output=True, text=True, timeout=DOWNLOAD_TIMEOUT_S)
    except (FileNotFoundError, PermissionError):
        raise Unavailable(package, "apt-get is not on the PATH") from None
    except subprocess.TimeoutExpired:
        raise Unavailable(package, f"apt-get download took over {DOWNLOAD_TIMEOUT_S} s") from None
    debs = [name for name in os.listdir(into) if name.endswith(".deb")]
    if result.returncode != 0 or len(debs) != 1:
        errors = [line for line in result.stderr.splitlines() if line.startswith("E:")]
        last = (errors or result.stderr.strip().splitlines() or ["no package downloaded"])[-1]
        raise Unavailable(package, " ".join(last.split()))
    return os.path.join(into, debs[0])


def ar_members(data: bytes) -> dict[str, bytes]:
    """The members of an ar archive (a .deb is one: debian-binary, control.tar.*, data.tar.*)."""
    if not data.startswith(_AR_MAGIC):
        raise UserError("not a Debian package (no ar header)")
    members, at = {}, len(_AR_MAGIC)
    while at + _AR_HEADER <= len(data):
        header = data[at:at + _AR_HEADER]
        if header[58:60] != b"`\n":
            raise UserError(f"corrupt Debian package: bad ar member header at byte {at}")
        name = header[:16].decode("ascii").strip().rstrip("/")  # GNU ar ends names with '/'
        size = int(header[48:58].decode("ascii"))
        members[name] = data[at + _AR_HEADER:at + _AR_HEADER + size]
        at += _AR_HEADER + size + (size % 2)  # members are padded to an even offset
    return members


def _data_tar(deb: str) -> tarfile.TarFile:
    with open(deb, "rb") as f:
        members = ar_members(f.read())
    name = next((n for n in members if n.startswith("data.tar")), None)
    if name is None:
        raise UserError(f"{os.path.basename(deb)} has no data.tar member")
    if name.endswith(".zst"):
        # Debian's own archive uses xz; zstd appears only in some derivatives' packages.
        raise UserError(f"{os.path.basename(deb)} is compressed with zstd, which is not supported")
    return tarfile.open(fileobj=io.BytesIO(members[name]), mode="r:*")


def _extract(deb: str, member: str, target: str) -> None:
    """Writes `member` (a file, or every file under a folder ending in '/') into `target`,
    under the member's own name."""
    with _data_tar(deb) as tar:
        files = {info.name.removeprefix("./"): info for info in tar.getmembers() if info.isfile()}
        folder = os.path.basename(member.rstrip("/"))
        if member.endswith("/"):
            wanted = {os.path.join(folder, name[len(member):]): info
                      for name, info in files.items() if name.startswith(member)}
        else:
            wanted = {folder: files[member]} if member in files else {}
        if not wanted:
            raise UserError(f"{os.path.basename(deb)} has no {member}")
        for relative, info in sorted(wanted.items()):
            out = os.path.join(target, relative)
            os.makedirs(os.path.dirname(out), exist_ok=True)
            with open(out, "wb") as f:
                f.write(tar.extractfile(info).read())


def fetch(spec: tuple[str, str]) -> str:
    """Local path of a file (or folder, for a member ending in '/') inside a Debian package,
    downloaded and extracted on first use."""
    package, member = spec
    if not re.fullmatch(r"[a-z0-9][a-z0-9+.-]*=[A-Za-z0-9.+~:-]+", package):
        raise UserError(f"a Debian package must be pinned as name=version, got {package!r}")
    root = packaged.cache_dir()
    target = os.path.join(root, "debian", package.replace("=", "-").replace(":", "_"))
    # A folder member gets its own subfolder, so that several members of one package can share
    # the package's cache folder (each appears whole, by rename).
    path = os.path.join(target, os.path.basename(member.rstrip("/")))
    if os.path.exists(path):
        return path
    with packaged.locked(root):
        if os.path.exists(path):
            return path  # another process fetched it while this one waited for the lock
        with tempfile.TemporaryDirectory(dir=root) as tmp:
            deb = _download(package, os.path.join(tmp, "download"))
            staged = os.path.join(tmp, "staged")
            _extract(deb, member, staged)
            packaged.publish(staged, target)
    return path
