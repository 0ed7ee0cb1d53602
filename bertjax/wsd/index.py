"""A sense index: one embedding per word sense, and the 1-nearest-neighbour sense of a word.

Files: DIR/wsd_index.json (the senses, layers and the model's parameter digest) and
DIR/sense_vectors.npz (the unit-length sense embeddings [senses, hidden]). Loading checks the
JSON's keys and types and the array's shape against it, before the model is loaded: a damaged
index is one line, "DIR is damaged: ...; rebuild it with `python -m bertjax.wsd fit`".
"""

from __future__ import annotations

import collections
import dataclasses
import hashlib
import json
import os
import zipfile
from typing import Sequence

import jax
import numpy as np

from bertjax.core import output_dir
from bertjax.core.errors import UserError
from bertjax.inference.api import load
from bertjax.retrieval import integrity
from bertjax.vectors.standardizer import Standardizer, require_same
from bertjax.wsd import wordnet
from bertjax.wsd.wordnet import Example, Sense

INFO_FILE = "wsd_index.json"
VECTORS_FILE = "sense_vectors.npz"
FORMAT = "bertjax-wsd-index"
# What `fit` writes, and so the only directory its overwrite replaces.
SENSE_INDEX = output_dir.Kind("sense index (from wsd fit)", directory=True,
                              holds=lambda path: os.path.isfile(os.path.join(path, INFO_FILE)))
VERSION = 1
REBUILD = "python -m bertjax.wsd fit"
INFO_SCHEMA = {
    "format": str, "version": int, "layers": (str, int, [int]),
    "model": {"path": str, "digest": str, "hidden_size": int},
    "standardizer": (None, {"digest": str, "method": str}),
    "senses": [{"id": str, "lemma": str, "pos": str, "offset": str, "definition": str,
                "examples": int}],
}
# What np.load raises on a truncated, garbage or foreign .npz.
NPZ_ERRORS = (zipfile.BadZipFile, ValueError, KeyError, OSError, EOFError)


def model_digest(model) -> str:
    """sha256 of the encoder's parameter names, shapes, dtypes and values: the same weights give
    the same digest wherever they are loaded from (a Hugging Face dir or its params export)."""
    digest = hashlib.sha256()
    leaves, _ = jax.tree_util.tree_flatten_with_path(model.loaded.params["encoder"])
    for path, leaf in leaves:
        array = np.ascontiguousarray(np.asarray(leaf))
        digest.update(f"{jax.tree_util.keystr(path)}:{array.dtype}:{array.shape};".encode())
        digest.update(array.tobytes())
    return digest.hexdigest()


class SenseIndex:
    """Sense embeddings of one model: `fit` them, then `predict` the sense of a word in context."""

    def __init__(self, model, senses: Sequence[Sense], vectors: np.ndarray,
                 counts: Sequence[int], layers, digest: str | None = None,
                 standardizer: Standardizer | None = None):
        self.model = model
        self.standardizer = standardizer  # word-vector statistics applied before comparing
        self.senses = list(senses)
        self.vectors = np.asarray(vectors, np.float32)  # [S, H], unit length
        self.counts = list(counts)                      # training examples per sense
        self.layers = layers
        self.digest = digest or model_digest(model)
        self._by_lemma: dict[str, list[int]] = collections.defaultdict(list)
        for i, sense in enumerate(self.senses):
            self._by_lemma[sense.lemma].append(i)

    @classmethod
    def fit(cls, model, examples: Sequence[Example], layers=-1,
            standardizer: Standardizer | None = None) -> SenseIndex:
        """Each sense's embedding: the normalised mean of its examples' target-word vectors
        (standardised first by `standardizer`, statistics of this model's word vectors)."""
        if not examples:
            raise UserError("no examples to fit a sense index on")
        vectors = _target_vectors(model, [(e.words, e.index) for e in examples], layers,
                                  standardizer)
        sums: dict[Sense, list] = {}
        for e, vector in zip(examples, vectors):
            if np.isfinite(vector).all():  # a target past max_seq_len has no vector
                sums.setdefault(e.sense, []).append(vector)
        if not sums:
            raise UserError("every example's target word lies past the model's max_seq_len")
        senses = list(sums)
        means = np.stack([np.mean(sums[s], axis=0) for s in senses])
        return cls(model, senses, _unit(means), [len(sums[s]) for s in senses],
                   layers_record(layers), standardizer=standardizer)

    # ---- prediction ------------------------------------------------------------------------

    @property
    def lemmas(self) -> list[str]:
        return list(self._by_lemma)

    def candidates(self, word: str, lemma: str | None = None) -> list[int]:
        """Indices of the senses `word` can have: those of `lemma` (or of any lemma) whose part
        of speech admits `word` as a form of the lemma."""
        exc = _exceptions()
        lemmas = [lemma.lower()] if lemma else _lemma_guesses(word, exc)
        return [i for name in lemmas for i in self._by_lemma.get(name, ())
                if wordnet.is_form_of(word, name, self.senses[i].pos, exc)]

    def locate(self, words: Sequence[str], word: str) -> tuple[int, str | None]:
        """Where `word` is in `words` (its first occurrence, else the first form of it as a
        lemma: "bank" finds "banks") and the lemma to restrict the senses to (None when the word
        itself was found: any lemma it can be a form of)."""
        target = word.lower()
        position = next((i for i, w in enumerate(words) if w.lower() == target), None)
        if position is not None:
            return position, None
        exc = _exceptions()
        position = next((i for i, w in enumerate(words) if any(
            wordnet.is_form_of(w, target, pos, exc) for pos in wordnet.POS_FILES)), None)
        if position is None:
            raise UserError(f"the word {word!r} does not occur in the sentence")
        return position, target

    def rank_many(self, items: Sequence[tuple[Sequence[str], int, str | None]]
                  ) -> list[list[tuple[Sense, float]]]:
        """For each (words, target index, lemma or None): the candidate senses with their cosine
        similarity to the target word's vector, best first."""
        choices = [self._checked_candidates(words, index, lemma) for words, index, lemma in items]
        vectors = _target_vectors(self.model, [(w, i) for w, i, _ in items], self.layers,
                                  self.standardizer)
        ranked = []
        for (words, index, _), options, vector in zip(items, choices, vectors):
            if not np.isfinite(vector).all():
                raise UserError(f"the word {words[index]!r} lies past the model's "
                                f"{self.model.max_seq_len}-token limit")
            scores = self.vectors[options] @ _unit(vector)
            order = np.argsort(-scores, kind="stable")
            ranked.append([(self.senses[options[k]], float(scores[k])) for k in order])
        return ranked

    def rank(self, words: Sequence[str], index: int, lemma: str | None = None
             ) -> list[tuple[Sense, float]]:
        return self.rank_many([(words, index, lemma)])[0]

    def predict(self, words: Sequence[str], index: int, lemma: str | None = None) -> Sense:
        """The sense of `words[index]` nearest by cosine."""
        return self.rank(words, index, lemma)[0][0]

    def most_frequent(self, words: Sequence[str], index: int, lemma: str | None = None) -> Sense:
        """The baseline: of the same candidates, the sense with the most training examples (ties:
        WordNet's lower sense number)."""
        options = self._checked_candidates(words, index, lemma)
        best = min(options, key=lambda i: (-self.counts[i], _sense_number(self.senses[i]), i))
        return self.senses[best]

    def _checked_candidates(self, words, index, lemma) -> list[int]:
        if isinstance(words, str):
            raise UserError("give the sentence as a list of words, not one string")
        if not 0 <= index < len(words):
            raise UserError(f"target index {index} is outside the sentence's {len(words)} words")
        options = self.candidates(words[index], lemma)
        if not options:
            what = f"the lemma {lemma!r}" if lemma else f"the word {words[index]!r}"
            raise UserError(f"the sense index has no senses for {what} (it has "
                            f"{len(self._by_lemma)} lemmas, e.g. "
                            f"{', '.join(sorted(self._by_lemma)[:3])})")
        return options

    # ---- files -----------------------------------------------------------------------------

    def save(self, directory: str, *, overwrite: bool = False) -> None:
        """DIR/wsd_index.json + DIR/sense_vectors.npz; DIR must not exist unless `overwrite`."""
        info = {"format": FORMAT, "version": VERSION, "layers": self.layers,
                "model": {"path": os.path.abspath(self.model.path), "digest": self.digest,
                          "hidden_size": int(self.vectors.shape[1])},
                "standardizer": self.standardizer.describe() if self.standardizer else None,
                "senses": [{**dataclasses.asdict(s), "examples": n}
                           for s, n in zip(self.senses, self.counts)]}
        with output_dir.staged(directory, overwrite=overwrite, kind=SENSE_INDEX) as staging:
            np.savez(os.path.join(staging, VECTORS_FILE), vectors=self.vectors)
            with open(os.path.join(staging, INFO_FILE), "w", encoding="utf-8") as f:
                json.dump(info, f, indent=1)

    @classmethod
    def load(cls, directory: str, model=None, standardizer: Standardizer | None = None
             ) -> SenseIndex:
        """The index in `directory`, with `model` (default: the model it was fitted with), which
        must be the model it was fitted with, and the statistics it was fitted with (or none)."""
        info = read_info(directory)
        require_same(info.get("standardizer"), standardizer,
                     f"the sense index {directory} was fitted")
        vectors = _read_vectors(directory, info)
        recorded = info["model"]
        if model is None:
            if not os.path.exists(recorded["path"]):
                raise UserError(f"the model {directory} was fitted with ({recorded['path']}) is "
                                "gone; name a copy of it with --model")
            model = load(recorded["path"])
        digest = model_digest(model)
        if digest != recorded["digest"]:
            raise UserError(f"the sense index {directory} was fitted with another model "
                            f"({recorded['path']}), not {model.path}; refit it or use that model")
        senses = [Sense(**{k: s[k] for k in ("id", "lemma", "pos", "offset", "definition")})
                  for s in info["senses"]]
        return cls(model, senses, vectors, [s["examples"] for s in info["senses"]],
                   info["layers"], digest, standardizer)


def damaged(directory: str, what: str) -> UserError:
    return UserError(f"{directory} is damaged: {what}; rebuild it with `{REBUILD}`")


def read_info(directory: str) -> dict:
    path = os.path.join(directory, INFO_FILE)
    if not os.path.isfile(path):
        raise UserError(f"{directory} is not a sense index (no {INFO_FILE}; make one with "
                        f"`{REBUILD}`)")
    try:
        info = integrity.read_json_object(path)
        if info.get("format") != FORMAT or info.get("version") != VERSION:
            raise UserError(f"{path} is not a version-{VERSION} {FORMAT}")
        integrity.check_schema(info, INFO_SCHEMA, INFO_FILE)
    except integrity.Damage as e:
        raise damaged(directory, str(e)) from None
    return info


def _read_vectors(directory: str, info: dict) -> np.ndarray:
    """The sense vectors, one row per sense of `info`, as wide as its model."""
    try:
        with np.load(os.path.join(directory, VECTORS_FILE)) as saved:
            vectors = saved["vectors"]
    except NPZ_ERRORS as e:
        raise damaged(directory, f"{VECTORS_FILE} is unreadable ({type(e).__name__}: "
                                 f"{e})") from None
    expected = (len(info["senses"]), info["model"]["hidden_size"])
    if vectors.shape != expected or not np.issubdtype(vectors.dtype, np.floating):
        raise damaged(directory, f"{VECTORS_FILE} holds {vectors.dtype} vectors of shape "
                                 f"{vectors.shape}, {INFO_FILE} describes {expected}")
    return vectors


def _target_vectors(model, items: Sequence[tuple[Sequence[str], int]], layers,
                    standardizer: Standardizer | None = None) -> list:
    sentences = [list(words) for words, _ in items]
    vectors = (model.word_vectors(sentences, layers=layers, standardize=standardizer)
               if sentences else [])
    return [v[index] for v, (_, index) in zip(vectors, items)]


def _unit(x: np.ndarray) -> np.ndarray:
    return x / np.maximum(np.linalg.norm(x, axis=-1, keepdims=True), 1e-12)


def layers_record(layers):
    if isinstance(layers, str):
        return layers
    return int(layers) if isinstance(layers, (int, np.integer)) else [int(i) for i in layers]


def _sense_number(sense: Sense) -> int:
    tail = sense.id.rsplit(".", 1)[-1]
    return int(tail) if tail.isdigit() else 0


def _exceptions():
    return wordnet.exceptions(wordnet.wordnet_dir())


def _lemma_guesses(word: str, exc) -> list[str]:
    """Every base form WordNet's morphology allows for `word`, in any part of speech."""
    return sorted(set().union(*(wordnet.base_forms(word, pos, exc) for pos in wordnet.POS_FILES)))
