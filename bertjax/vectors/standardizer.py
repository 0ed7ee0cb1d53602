"""Post-processing embeddings before they are compared: z-scoring and "all-but-the-top".

Contextual embeddings are anisotropic: they share a large common direction and a few dimensions
of large variance, so any two have a high cosine and those dimensions dominate it. Two remedies:

- z-scoring: subtract the per-dimension mean and divide by the per-dimension standard deviation
  (every dimension then counts alike);
- all-but-the-top (Mu & Viswanath 2018, "All-but-the-Top: Simple and Effective Postprocessing for
  Word Representations"): subtract the mean and remove the projection on the top D principal
  components (default D = hidden size / 100, as the paper suggests).

Both are fitted once on the vectors of a reference corpus (streamed in blocks, accumulated in
float64) and saved to one .npz file: the arrays, and a JSON record of what the statistics are of
(the model's fingerprint, sentence or word vectors, pooling, layers, corpus, count). Vectors made
with statistics may only be compared with vectors made with the same ones; `digest` names them.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import zipfile
from typing import Iterable

import numpy as np

from bertjax.core import output_dir
from bertjax.core.errors import UserError, check_choice

FORMAT = "bertjax-standardizer"
VERSION = 1
ZSCORE, ALL_BUT_THE_TOP = "zscore", "all-but-the-top"
METHODS = (ZSCORE, ALL_BUT_THE_TOP)
ARRAYS = ("mean", "scale", "components")
# A dimension whose spread is below this (relative to the largest) is constant on the corpus:
# dividing by it would blow noise up, so it is left unscaled and counted.
CONSTANT = 1e-6


@dataclasses.dataclass(frozen=True)
class Standardizer:
    method: str
    mean: np.ndarray        # [H] float64
    scale: np.ndarray       # [H] the per-dimension standard deviation (z-score); ones otherwise
    components: np.ndarray  # [D, H] orthonormal directions removed (all-but-the-top); [0, H]
    about: dict             # what the statistics are of (see the module docstring)

    @property
    def dim(self) -> int:
        return int(self.mean.shape[0])

    @property
    def digest(self) -> str:
        """A hex digest of the method and the arrays: equal digests, equal transforms."""
        digest = hashlib.sha256(self.method.encode())
        for array in (self.mean, self.scale, self.components):
            digest.update(np.ascontiguousarray(array, np.float64).tobytes())
        return digest.hexdigest()[:32]

    def apply(self, vectors: np.ndarray) -> np.ndarray:
        """[N, H] -> the transformed [N, H] float32."""
        vectors = np.asarray(vectors, np.float64)
        if vectors.ndim != 2 or vectors.shape[1] != self.dim:
            raise UserError(f"the statistics are of {self.dim}-dimensional vectors, these are "
                            f"{vectors.shape[1:] or 'a scalar'}")
        centred = (vectors - self.mean) / self.scale
        if len(self.components):
            centred -= (centred @ self.components.T) @ self.components
        return centred.astype(np.float32)

    def describe(self) -> dict:
        """The record an output made with these statistics keeps (an index's manifest)."""
        return {"digest": self.digest, "method": self.method,
                "removed_components": int(len(self.components)), **self.about}


def require_same(recorded: dict | None, given: Standardizer | None, made: str) -> None:
    """Vectors made with statistics are compared only with vectors made with the same ones:
    `given` must be the statistics `recorded` describes (`describe()`), or both None. `made`
    names the output in the refusal ("INDEX was built")."""
    if recorded and given is None:
        raise UserError(f"{made} with {recorded['method']} statistics (digest "
                        f"{recorded['digest']}); pass the same statistics file with --standardize")
    if given is not None and not recorded:
        raise UserError(f"{made} without standardisation; drop --standardize")
    if given is not None and given.digest != recorded["digest"]:
        raise UserError(f"these statistics (digest {given.digest}) are not the ones {made} with "
                        f"(digest {recorded['digest']})")


class Moments:
    """Count, per-dimension sum and sum of outer products of a stream of [n, H] blocks."""

    def __init__(self):
        self.count = 0
        self.total: np.ndarray | None = None
        self.outer: np.ndarray | None = None

    def add(self, block: np.ndarray) -> None:
        block = np.asarray(block, np.float64)
        if block.ndim != 2:
            raise ValueError(f"expected [n, H] vectors, got shape {block.shape}")
        if not np.isfinite(block).all():
            raise UserError("the reference vectors hold non-finite values; statistics need "
                            "finite vectors")
        if self.total is None:
            self.total = np.zeros(block.shape[1])
            self.outer = np.zeros((block.shape[1], block.shape[1]))
        self.count += len(block)
        self.total += block.sum(axis=0)
        self.outer += block.T @ block

    def mean(self) -> np.ndarray:
        return self.total / self.count

    def covariance(self) -> np.ndarray:
        mean = self.mean()
        return self.outer / self.count - np.outer(mean, mean)


def default_components(dim: int) -> int:
    return max(1, round(dim / 100))


def fit(blocks: Iterable[np.ndarray], method: str, about: dict, *,
        components: int | None = None) -> Standardizer:
    """Statistics of the vectors in `blocks` (an iterable of [n, H] arrays)."""
    check_choice("method", method, METHODS, unknown=True)
    moments = Moments()
    for block in blocks:
        moments.add(block)
    if moments.count < 2:
        raise UserError(f"statistics need at least 2 reference vectors, got {moments.count}")
    mean, covariance = moments.mean(), moments.covariance()
    dim = len(mean)
    about = {**about, "count": moments.count}
    if method == ZSCORE:
        spread = np.sqrt(np.maximum(np.diag(covariance), 0.0))
        constant = spread <= CONSTANT * max(float(spread.max()), 1e-30)
        about["constant_dimensions"] = int(constant.sum())
        return Standardizer(method, mean, np.where(constant, 1.0, spread), np.zeros((0, dim)),
                            about)
    removed = default_components(dim) if components is None else components
    if not 1 <= removed < dim:
        raise UserError(f"all-but-the-top removes between 1 and {dim - 1} components of "
                        f"{dim}-dimensional vectors, not {removed}")
    _, eigenvectors = np.linalg.eigh(covariance)  # ascending eigenvalues
    top = eigenvectors[:, ::-1][:, :removed].T
    return Standardizer(method, mean, np.ones(dim), np.ascontiguousarray(top), about)


def _is_statistics_file(path: str) -> bool:
    try:
        with zipfile.ZipFile(path) as archive:
            return "record.npy" in archive.namelist()
    except (OSError, zipfile.BadZipFile):
        return False


# What `save` writes, and so the only file its overwrite replaces.
STATISTICS = output_dir.Kind("statistics file (.npz from --fit-standardizer)", directory=False,
                             holds=_is_statistics_file)


def check_output(path: str, *, overwrite: bool, sources: tuple = ()) -> None:
    """Refuses STATS before the statistics are fitted: see `bertjax.core.output_dir`."""
    if os.path.isdir(path):
        raise UserError(f"{path} is a directory; give the .npz file to write")
    output_dir.check_target(path, overwrite=overwrite, kind=STATISTICS, sources=sources)


def save(standardizer: Standardizer, path: str, *, overwrite: bool = False,
         sources: tuple = ()) -> None:
    """STATS as one .npz, written whole or not at all; never over a file without `overwrite`,
    over another kind of file, or over one of `sources`."""
    check_output(path, overwrite=overwrite, sources=sources)
    record = {"format": FORMAT, "version": VERSION, "method": standardizer.method,
              "about": standardizer.about}
    with output_dir.staged_file(path, overwrite=overwrite, kind=STATISTICS,
                                sources=sources) as f:
        np.savez(f, mean=standardizer.mean, scale=standardizer.scale,
                 components=standardizer.components, record=np.array(json.dumps(record)))


def load(path: str) -> Standardizer:
    """The statistics in STATS, every part checked: one UserError line naming what is wrong."""
    if not os.path.isfile(path):
        raise UserError(f"statistics file not found: {path} (fit one with `python -m "
                        "bertjax.embed --fit-standardizer`)")
    try:
        opened = np.load(path, allow_pickle=False)
        if not isinstance(opened, np.lib.npyio.NpzFile):  # a .npy: one array, no record
            raise UserError(f"{path} is not a bertjax statistics file (one array, not the .npz "
                            "that --fit-standardizer writes)")
        with opened as saved:
            missing = [key for key in (*ARRAYS, "record") if key not in saved.files]
            if missing:
                raise UserError(f"{path} is not a bertjax statistics file (no {missing[0]})")
            arrays = {key: np.asarray(saved[key], np.float64) for key in ARRAYS}
            record = json.loads(str(saved["record"]))
    except (OSError, ValueError, EOFError, zipfile.BadZipFile) as e:
        if isinstance(e, UserError):
            raise
        raise UserError(f"{path} is not a readable statistics file ({e})") from None
    if not isinstance(record, dict) or record.get("format") != FORMAT or \
            record.get("version") != VERSION or record.get("method") not in METHODS or \
            not isinstance(record.get("about"), dict):
        raise UserError(f"{path} is not a version-{VERSION} {FORMAT} file")
    mean, scale, components = arrays["mean"], arrays["scale"], arrays["components"]
    if mean.ndim != 1 or scale.shape != mean.shape or components.ndim != 2 or \
            components.shape[1] != mean.shape[0]:
        raise UserError(f"{path} is damaged: its arrays' shapes disagree")
    if not all(np.isfinite(a).all() for a in (mean, scale, components)) or (scale <= 0).any():
        raise UserError(f"{path} is damaged: non-finite values or a non-positive scale")
    return Standardizer(record["method"], mean, scale, components, record["about"])
