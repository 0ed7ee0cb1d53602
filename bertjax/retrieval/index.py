"""The vector index on disk: a corpus embedded by one model, searchable exactly or approximately.

    INDEX/manifest.json     format, the model (path, step, kind, encoder config, fingerprint),
                            pooling, sequence limit, counts, the standardisation statistics'
                            digest (or null), the approximate index's settings, its size and its
                            recall against exact search measured at build time, and each other
                            file's size and sha256 ("files")
    INDEX/vectors.npy       [N, H] fp32, unit length (cosine = inner product), row i = document i
    INDEX/documents.jsonl   the corpus as read ({"id", "text"}), in row order: search results
                            name documents by id, and re-ranking and BM25 need the texts
    INDEX/hnsw.faiss        the approximate index (with --approximate; see `approximate`)

An index is built in a staging directory and renamed into place whole; an existing one is only
replaced with overwrite. Opening one checks the manifest's keys and types, every file's size,
the digests of the vectors and documents, and the counts; the FAISS graph's digest, size and
dimension are checked when it is first used (`approximate_index`), so an exact search never
reads it. Hashing costs about 1 ms per MB (a 5,000 x 384 index: 6 ms for its 7.7 MB of vectors,
7 ms for its 9 MB graph), nothing beside loading the query model, so digests are verified on
every use rather than trusted from an earlier one. Anything that does not match is refused as
"INDEX is damaged: ...; rebuild it". Version 1 indexes recorded no digests: they are refused,
to be rebuilt, rather than opened unverified.

Queries must be embedded by the same model: `query_model` loads the model the manifest names and
refuses one whose fingerprint differs.

Models come in through a `ModelLoader` the caller passes (the command line passes
`bertjax.load`): retrieval sits below the Python API, which fine-tuning's retrieval task (built
on `exact` and `metrics`) must not reach. A model is anything with `embed(texts, pooling,
normalize=True)`, `loaded` (`bertjax.inference.loading.Loaded`), `config`, `max_seq_len` and
`truncated`, as `bertjax.load`'s Model has.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys
from typing import Any, Callable

import numpy as np

from bertjax.core import atomic_files, output_dir, storage, transfer
from bertjax.core.errors import UserError, check_choice
from bertjax.model.pooling import POOLINGS
from bertjax.retrieval import approximate, exact, integrity
from bertjax.retrieval.fingerprint import fingerprint
from bertjax.retrieval.inputs import Document, read_corpus
from bertjax.retrieval.metrics import overlap_recall
from bertjax.vectors.standardizer import Standardizer, require_same

FORMAT = "bertjax-index"
VERSION = 2   # 2: the manifest records each file's size and sha256, and the graph's size
UNVERIFIABLE_VERSIONS = (1,)
REBUILD = "python -m bertjax.index build --overwrite"
MANIFEST, VECTORS, DOCUMENTS, HNSW = ("manifest.json", "vectors.npy", "documents.jsonl",
                                      "hnsw.faiss")
EMBED_BLOCK = 4096      # texts embedded per call, so a large corpus streams into the .npy
RECALL_SAMPLE, RECALL_K = 200, 10
# What `build` writes, and so the only directory its overwrite replaces.
def _holds_an_index(path: str) -> bool:
    """Whether `path` holds an index (a prepared corpus has a manifest.json too)."""
    try:
        with open(os.path.join(path, MANIFEST), encoding="utf-8") as f:
            return json.load(f).get("format") == FORMAT
    except (OSError, UnicodeDecodeError, ValueError, AttributeError):
        return False


INDEX_KIND = output_dir.Kind("retrieval index (from index build)", directory=True,
                             holds=_holds_an_index)
# (path, step or None for its default) -> a loaded model
ModelLoader = Callable[[str, "int | None"], Any]
MANIFEST_SCHEMA = {
    "format": str, "version": int,
    "model": {"path": str, "kind": str, "step": (int, None), "encoder": dict,
              "fingerprint": str},
    "pooling": str, "max_seq_len": int, "corpus": str, "documents": int, "dim": int,
    "standardizer": (None, {"digest": str, "method": str}), "truncated": int,
    "approximate": (None, {"library": str, "kind": str, "ntotal": int,
                           "recall_at_build": {"queries": int, "k": int, "recall": float}}),
    "files": {VECTORS: integrity.FILE_RECORD, DOCUMENTS: integrity.FILE_RECORD},
}


@dataclasses.dataclass
class Index:
    path: str
    manifest: dict
    documents: list[Document]
    vectors: np.ndarray          # memory-mapped
    _approximate: object = None
    standardizer: Standardizer | None = None  # queries' statistics (`require_standardizer`)

    @property
    def size(self) -> int:
        return len(self.documents)

    @property
    def has_approximate(self) -> bool:
        return self.manifest.get("approximate") is not None

    def approximate_index(self):
        if not self.has_approximate:
            raise UserError(f"{self.path} has no approximate index; rebuild it with "
                            "--approximate or search with --exact")
        if self._approximate is None:
            try:
                self._approximate = _verified_graph(self.path, self.manifest)
            except integrity.Damage as e:
                raise damaged(self.path, str(e)) from None
        return self._approximate


def damaged(path: str, what: str) -> UserError:
    return UserError(f"{path} is damaged: {what}; rebuild it with `{REBUILD}`")


def model_record(model) -> dict:
    loaded = model.loaded
    return {"path": loaded.path, "kind": loaded.kind, "step": loaded.step,
            "encoder": loaded.encoder.record(),
            "fingerprint": fingerprint(loaded.encoder, loaded.params)}


def embed(model, texts: list[str], pooling: str, standardizer: Standardizer | None = None
          ) -> np.ndarray:
    return model.embed(texts, pooling, normalize=True, standardize=standardizer)


def build(model_path: str, corpus_path: str, output: str, load_model: ModelLoader, *,
          pooling: str = "mean", with_approximate: bool = False, overwrite: bool = False,
          standardizer: Standardizer | None = None) -> dict:
    """Writes INDEX with the model `load_model` loads from `model_path` (after every check of
    the input: a refused build loads nothing); returns its manifest. With `standardizer`, the
    vectors are standardised before they are normalised, and the manifest records the
    statistics: queries must then be standardised by the same ones."""
    output_dir.check_target(output, overwrite=overwrite, kind=INDEX_KIND,
                            sources=(model_path, corpus_path))
    check_choice("pooling", pooling, POOLINGS, unknown=True)
    if with_approximate:
        approximate.library()  # no FAISS: refused before anything is read or embedded
    documents = read_corpus(corpus_path)
    model = load_model(model_path, None)
    if standardizer is not None:  # refused before any output exists if not of this model
        embed(model, [], pooling, standardizer)
    manifest = {"format": FORMAT, "version": VERSION, "model": model_record(model),
                "pooling": pooling, "max_seq_len": model.max_seq_len,
                "corpus": storage.absolute(corpus_path), "documents": len(documents),
                "dim": model.config.hidden_size,
                "standardizer": standardizer.describe() if standardizer else None}
    output_dir.check_space(output, _bytes_needed(documents, manifest["dim"], with_approximate))
    with output_dir.staged(output, overwrite=overwrite, kind=INDEX_KIND,
                           sources=(model_path, corpus_path)) as staging:
        _write_vectors(os.path.join(staging, VECTORS), model, documents, pooling, standardizer)
        vectors = np.load(os.path.join(staging, VECTORS), mmap_mode="r")
        manifest["truncated"] = model.truncated
        with atomic_files.replacing(os.path.join(staging, DOCUMENTS)) as f:
            f.writelines(json.dumps({"id": d.id, "text": d.text}, ensure_ascii=False) + "\n"
                         for d in documents)
        manifest["approximate"] = None
        if with_approximate:
            graph = approximate.build(vectors)
            approximate.save(graph, os.path.join(staging, HNSW))
            manifest["approximate"] = {**approximate.describe(), "ntotal": int(graph.ntotal),
                                       "recall_at_build": _sampled_recall(vectors, graph)}
        manifest["files"] = {name: integrity.file_record(os.path.join(staging, name))
                             for name in _files(manifest)}
        atomic_files.write_json(os.path.join(staging, MANIFEST), manifest)
        del vectors
    return manifest


def _bytes_needed(documents: list[Document], dim: int, with_approximate: bool) -> int:
    """About what the index takes on disk: the vectors, the texts, and the graph (vectors and
    32 links a document)."""
    vectors = len(documents) * dim * 4
    texts = sum(len(d.text.encode("utf-8")) + len(d.id) + 24 for d in documents)
    return vectors + texts + (vectors + len(documents) * 32 * 8 if with_approximate else 0)


def _write_vectors(path: str, model, documents: list[Document], pooling: str,
                   standardizer: Standardizer | None) -> None:
    """The [N, H] float32 .npy, streamed block by block with write(), not through a writable
    memory map: on a full disk, a page of a map that cannot be written kills the process with
    SIGBUS (leaving the staging directory behind) where write() raises ENOSPC."""
    shape = (len(documents), model.config.hidden_size)
    with open(path, "wb") as f:
        np.lib.format.write_array_header_1_0(f, {
            "descr": np.lib.format.dtype_to_descr(np.dtype(np.float32)),
            "fortran_order": False, "shape": shape})
        for start in range(0, len(documents), EMBED_BLOCK):
            block = documents[start:start + EMBED_BLOCK]
            vectors = embed(model, [d.text for d in block], pooling, standardizer)
            f.write(np.ascontiguousarray(vectors, dtype=np.float32).tobytes())
            if len(documents) > EMBED_BLOCK:
                print(f"embedded {start + len(block)}/{len(documents)} documents",
                      file=sys.stderr)


def _sampled_recall(vectors: np.ndarray, graph) -> dict:
    """Approximate vs exact top 10 for up to 200 stored vectors used as queries (each finds
    itself first in both, so this slightly flatters the approximate index; search
    --report-recall measures it on real queries)."""
    rng = np.random.default_rng(0)
    rows = np.sort(rng.choice(len(vectors), min(RECALL_SAMPLE, len(vectors)), replace=False))
    queries = np.asarray(vectors[rows])
    k = min(RECALL_K, len(vectors))
    _, exact_ids = exact.search(vectors, queries, k)
    _, approximate_ids = approximate.search(graph, queries, k)
    return {"queries": len(rows), "k": k, "recall": overlap_recall(approximate_ids, exact_ids),
            "queries_from": "stored vectors"}


def open_index(path: str) -> Index:
    """The index at `path`, its manifest, sizes, counts and the digests of its vectors and
    documents verified (the graph's wait for `approximate_index`); a URL, from a local copy."""
    path = transfer.local_copy(path)
    manifest_path = os.path.join(path, MANIFEST)
    if not os.path.isfile(manifest_path):
        raise UserError(f"{path} is not a bertjax index (no {MANIFEST}); build one with "
                        "`python -m bertjax.index build`")
    try:
        manifest = _checked_manifest(path, integrity.read_json_object(manifest_path))
        records = manifest["files"]
        integrity.check_sizes(path, {name: records[name] for name in _files(manifest)})
        integrity.check_digests(path, {name: records[name] for name in (VECTORS, DOCUMENTS)})
        try:
            vectors = np.load(os.path.join(path, VECTORS), mmap_mode="r")
        except (OSError, ValueError, EOFError) as e:
            raise integrity.Damage(f"{VECTORS} is not a .npy array ({e})") from None
        documents = read_corpus(os.path.join(path, DOCUMENTS))
        expected = (manifest["documents"], manifest["dim"])
        if vectors.shape != expected or len(documents) != expected[0]:
            raise integrity.Damage(f"{len(documents)} documents and vectors of shape "
                                   f"{vectors.shape}, the manifest says {expected}")
    except integrity.Damage as e:
        raise damaged(path, str(e)) from None
    return Index(os.path.abspath(path), manifest, documents, vectors)


def _checked_manifest(path: str, manifest: dict) -> dict:
    if manifest.get("format") != FORMAT:
        raise UserError(f"{path} is not a bertjax index ({MANIFEST} is of another format)")
    if manifest.get("version") in UNVERIFIABLE_VERSIONS:
        raise UserError(f"{path} was built by an earlier bertjax (index format version "
                        f"{manifest['version']}, which records no file digests to verify it "
                        f"by); rebuild it with `{REBUILD}`")
    if manifest.get("version") != VERSION:
        raise UserError(f"{path} is not a version-{VERSION} bertjax index")
    integrity.check_schema(manifest, MANIFEST_SCHEMA, MANIFEST)
    if manifest["approximate"] is not None:
        integrity.check_schema(manifest["files"], {HNSW: integrity.FILE_RECORD},
                               f"{MANIFEST}'s files")
    return manifest


def _files(manifest: dict) -> tuple[str, ...]:
    """The files besides the manifest that make up the index the manifest describes."""
    return (VECTORS, DOCUMENTS) + ((HNSW,) if manifest["approximate"] is not None else ())


def _verified_graph(path: str, manifest: dict):
    """The FAISS graph, once its file is the one built and it indexes the manifest's vectors."""
    integrity.check_digests(path, {HNSW: manifest["files"][HNSW]})
    try:
        graph = approximate.load(os.path.join(path, HNSW))
    except approximate.FaissError as e:
        raise integrity.Damage(f"FAISS cannot read {HNSW} ({e})") from None
    found = (int(graph.ntotal), int(graph.d))
    if found != (manifest["documents"], manifest["dim"]) or \
            found[0] != manifest["approximate"]["ntotal"]:
        raise integrity.Damage(f"{HNSW} indexes {found[0]} vectors of dimension {found[1]}, the "
                               f"manifest says {manifest['documents']} of {manifest['dim']}")
    return graph


def query_model(index: Index, load_model: ModelLoader, model_path: str | None = None):
    """The model to embed queries with, loaded by `load_model`: `model_path` or the one the index
    names, refused unless its fingerprint is the index's."""
    built_by = index.manifest["model"]
    if model_path is None and not storage.exists(built_by["path"]):
        raise UserError(f"the model that built {index.path} ({built_by['path']}) is gone; pass "
                        "--model with the same model")
    # Only a workdir is read at a step; an export records its source's step for information.
    step = built_by.get("step") if model_path is None and built_by.get("kind") == "workdir" \
        else None
    model = load_model(model_path or built_by["path"], step)
    found = fingerprint(model.loaded.encoder, model.loaded.params)
    if found != built_by["fingerprint"]:
        if model_path is not None:
            raise UserError(f"{index.path} is an index built by another model "
                            f"({built_by['path']}); {model_path} would embed queries into a "
                            "different space")
        raise UserError(f"the model at {built_by['path']} has changed since {index.path} was "
                        "built; rebuild the index")
    return model


def require_standardizer(index: Index, standardizer: Standardizer | None) -> None:
    """Queries are standardised as the index's vectors were, or not at all."""
    require_same(index.manifest.get("standardizer"), standardizer, f"{index.path} was built")
    index.standardizer = standardizer


def embed_queries(index: Index, model, texts: list[str]) -> np.ndarray:
    return embed(model, texts, index.manifest["pooling"], index.standardizer)
