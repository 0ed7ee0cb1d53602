"""The vector index on disk: a corpus embedded by one model, searchable exactly or approximately.

    INDEX/manifest.json     format, the model (path, step, kind, encoder config, fingerprint),
                            pooling, sequence limit, counts, the standardisation statistics'
                            digest (or null), the approximate index's settings and its recall
                            against exact search measured at build time
    INDEX/vectors.npy       [N, H] fp32, unit length (cosine = inner product), row i = document i
    INDEX/documents.jsonl   the corpus as read ({"id", "text"}), in row order: search results
                            name documents by id, and re-ranking and BM25 need the texts
    INDEX/hnsw.faiss        the approximate index (with --approximate; see `approximate`)

An index is built in a staging directory and renamed into place whole; an existing one is only
replaced with overwrite. Queries must be embedded by the same model: `query_model` loads the
model the manifest names and refuses one whose fingerprint differs.

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

from bertjax.core import atomic_files
from bertjax.core.errors import UserError, check_choice
from bertjax.core import output_dir
from bertjax.model.pooling import POOLINGS
from bertjax.retrieval import approximate, exact
from bertjax.retrieval.fingerprint import fingerprint
from bertjax.retrieval.inputs import Document, read_corpus
from bertjax.retrieval.metrics import overlap_recall
from bertjax.vectors.standardizer import Standardizer, require_same

FORMAT = "bertjax-index"
VERSION = 1
MANIFEST, VECTORS, DOCUMENTS, HNSW = ("manifest.json", "vectors.npy", "documents.jsonl",
                                      "hnsw.faiss")
EMBED_BLOCK = 4096      # texts embedded per call, so a large corpus streams into the .npy
RECALL_SAMPLE, RECALL_K = 200, 10
# (path, step or None for its default) -> a loaded model
ModelLoader = Callable[[str, "int | None"], Any]


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
            self._approximate = approximate.load(os.path.join(self.path, HNSW))
        return self._approximate


def model_record(model) -> dict:
    loaded = model.loaded
    return {"path": loaded.path, "kind": loaded.kind, "step": loaded.step,
            "encoder": dataclasses.asdict(loaded.encoder),
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
    output_dir.check_target(output, overwrite=overwrite, sources=(model_path, corpus_path))
    check_choice("pooling", pooling, POOLINGS, unknown=True)
    documents = read_corpus(corpus_path)
    model = load_model(model_path, None)
    if standardizer is not None:  # refused before any output exists if not of this model
        embed(model, [], pooling, standardizer)
    manifest = {"format": FORMAT, "version": VERSION, "model": model_record(model),
                "pooling": pooling, "max_seq_len": model.max_seq_len,
                "corpus": os.path.abspath(corpus_path), "documents": len(documents),
                "dim": model.config.hidden_size,
                "standardizer": standardizer.describe() if standardizer else None}
    with output_dir.staged(output, overwrite=overwrite) as staging:
        vectors = np.lib.format.open_memmap(os.path.join(staging, VECTORS), mode="w+",
                                            dtype=np.float32,
                                            shape=(len(documents), model.config.hidden_size))
        for start in range(0, len(documents), EMBED_BLOCK):
            block = documents[start:start + EMBED_BLOCK]
            vectors[start:start + len(block)] = embed(model, [d.text for d in block], pooling,
                                                      standardizer)
            if len(documents) > EMBED_BLOCK:
                print(f"embedded {start + len(block)}/{len(documents)} documents",
                      file=sys.stderr)
        vectors.flush()
        manifest["truncated"] = model.truncated
        with atomic_files.replacing(os.path.join(staging, DOCUMENTS)) as f:
            f.writelines(json.dumps({"id": d.id, "text": d.text}, ensure_ascii=False) + "\n"
                         for d in documents)
        manifest["approximate"] = None
        if with_approximate:
            graph = approximate.build(vectors)
            approximate.save(graph, os.path.join(staging, HNSW))
            manifest["approximate"] = {**approximate.describe(),
                                       "recall_at_build": _sampled_recall(vectors, graph)}
        atomic_files.write_json(os.path.join(staging, MANIFEST), manifest)
        del vectors
    return manifest


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
    manifest_path = os.path.join(path, MANIFEST)
    if not os.path.isfile(manifest_path):
        raise UserError(f"{path} is not a bertjax index (no {MANIFEST}); build one with "
                        "`python -m bertjax.index build`")
    try:
        with open(manifest_path, encoding="utf-8") as f:
            manifest = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise UserError(f"{manifest_path} is unreadable ({e}); rebuild the index") from None
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT or \
            manifest.get("version") != VERSION:
        raise UserError(f"{path} is not a version-{VERSION} bertjax index")
    try:
        vectors = np.load(os.path.join(path, VECTORS), mmap_mode="r")
        documents = read_corpus(os.path.join(path, DOCUMENTS))
    except (OSError, ValueError) as e:
        raise UserError(f"{path} is damaged ({e}); rebuild it") from None
    if vectors.shape != (manifest["documents"], manifest["dim"]) or len(documents) != len(vectors):
        raise UserError(f"{path} is damaged: {len(vectors)} vectors, {len(documents)} documents, "
                        f"the manifest says {manifest['documents']}; rebuild it")
    return Index(os.path.abspath(path), manifest, documents, vectors)


def query_model(index: Index, load_model: ModelLoader, model_path: str | None = None):
    """The model to embed queries with, loaded by `load_model`: `model_path` or the one the index
    names, refused unless its fingerprint is the index's."""
    built_by = index.manifest["model"]
    if model_path is None and not os.path.exists(built_by["path"]):
        raise UserError(f"the model that built {index.path} ({built_by['path']}) is gone; pass "
                        "--model with the same model")
    step = built_by.get("step") if model_path is None else None
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
