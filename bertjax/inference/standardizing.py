"""Standardisation statistics of a loaded model's vectors: fitted on a reference corpus, and
checked before use against the model, the kind of vectors, the pooling and the layers (the
transform itself is `bertjax.vectors.standardizer`'s).

Statistics describe one space: sentence vectors of one pooling over chosen layers, or word
vectors (`Model.word_vectors`: a word's subword states averaged over the chosen layers, what the
sense index compares) of one model. Applied to any other space they would silently distort it,
so every mismatch is refused, naming it.
"""

from __future__ import annotations

import os
from typing import Sequence

import numpy as np

from bertjax.core.errors import UserError
from bertjax.retrieval.fingerprint import fingerprint
from bertjax.vectors import standardizer as transforms
from bertjax.vectors.standardizer import Standardizer

SENTENCES, WORDS = "sentences", "words"
FIT_BLOCK = 1024   # texts embedded per call while fitting: statistics stream, vectors do not pile up


def model_fingerprint(model) -> str:
    return fingerprint(model.loaded.encoder, model.loaded.params)


def resolve(standardize) -> Standardizer | None:
    """None, a Standardizer, or the path of a statistics file -> None or a Standardizer."""
    if standardize is None or isinstance(standardize, Standardizer):
        return standardize
    if isinstance(standardize, (str, os.PathLike)):
        return transforms.load(os.fspath(standardize))
    raise TypeError(f"standardize: give a statistics file's path or a Standardizer, got "
                    f"{type(standardize).__name__}")


def check_fits(model, stats: Standardizer, vectors: str, layers: Sequence[int],
               pooling: str | None = None) -> None:
    about = stats.about
    if about.get("model", {}).get("fingerprint") != model_fingerprint(model):
        raise UserError(f"the statistics are of another model ({about.get('model', {}).get('path')}"
                        f"), not {model.path}; fit them with this model")
    if about.get("vectors") != vectors:
        raise UserError(f"the statistics are of {about.get('vectors')} vectors, not {vectors} "
                        "vectors; fit them for the vectors they will standardise")
    if vectors == SENTENCES and about.get("pooling") != pooling:
        raise UserError(f"the statistics are of {about.get('pooling')} pooling, not {pooling}")
    if list(about.get("layers", [])) != list(layers):
        raise UserError(f"the statistics are of layers {about.get('layers')}, not "
                        f"{list(layers)}; fit them for the same layers")


def fit(model, texts: Sequence[str], method: str, *, vectors: str = SENTENCES,
        pooling: str = "mean", layers="all", components: int | None = None,
        corpus: str | None = None) -> Standardizer:
    """Statistics of `model`'s vectors of `texts` (sentence vectors of `pooling`, or with
    vectors="words" the word vectors of the texts split on whitespace)."""
    if vectors not in (SENTENCES, WORDS):
        raise UserError(f"vectors must be {SENTENCES} or {WORDS}, got {vectors!r}")
    chosen = model.layer_indices(layers)
    about = {"model": {"path": model.path, "fingerprint": model_fingerprint(model)},
             "vectors": vectors, "pooling": pooling if vectors == SENTENCES else None,
             "layers": list(chosen), "corpus": corpus}

    def blocks():
        for start in range(0, len(texts), FIT_BLOCK):
            block = list(texts[start:start + FIT_BLOCK])
            if vectors == SENTENCES:
                yield model.embed(block, pooling, layers=chosen)
            else:
                per_text = model.word_vectors([t.split() for t in block], chosen)
                rows = np.concatenate([np.zeros((0, model.config.hidden_size)), *per_text])
                yield rows[np.isfinite(rows).all(axis=1)]  # words past max_seq_len are NaN

    return transforms.fit(blocks(), method, about, components=components)


def standardized(vectors: np.ndarray, stats: Standardizer, normalize: bool) -> np.ndarray:
    out = stats.apply(vectors)
    if normalize:
        out /= np.maximum(np.linalg.norm(out, axis=-1, keepdims=True), 1e-12)
    return out
