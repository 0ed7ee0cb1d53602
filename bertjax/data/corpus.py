"""The prepared-corpus format on disk: token shards with sentence and document boundaries.

    DIR/manifest.json              written last and atomically; its presence means "complete"
    DIR/tokenizer/                 the tokenizer the ids belong to (see tokenizer.py)
    DIR/shards/shard-NNNNN/        one directory per shard, renamed into place only when whole:
        tokens.npy                 uint16 (vocab <= 65536) or int32, all sentences back to back
        sentence_bounds.npy        int64[num_sentences + 1], offsets into tokens
        document_bounds.npy        int64[num_documents + 1], offsets into the shard's sentences
        token_counts.npy           int64[vocab_size], for unigram-frequency random replacement

Documents never straddle shards. The reader memory-maps the token arrays, so a corpus far larger
than RAM costs only its boundary arrays (8 bytes a sentence).
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import tempfile
from typing import Sequence

import numpy as np

from bertjax.core import atomic_files
from bertjax.data.tokenizer import Tokenizer, load_tokenizer
from bertjax.core.errors import UserError
from bertjax.core.file_modes import publish

FORMAT = "bertjax-corpus"
VERSION = 1
MANIFEST = "manifest.json"
SHARDS_DIR = "shards"
TOKENIZER_DIR = "tokenizer"
_ARRAYS = ("tokens", "sentence_bounds", "document_bounds", "token_counts")


def token_dtype(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= 1 << 16 else np.dtype(np.int32)


def shard_name(index: int) -> str:
    return f"shard-{index:05d}"


def shard_path(directory: str, index: int) -> str:
    return os.path.join(directory, SHARDS_DIR, shard_name(index))


def shard_is_complete(directory: str, index: int) -> bool:
    return os.path.isdir(shard_path(directory, index))


@dataclasses.dataclass(frozen=True)
class ShardStats:
    documents: int
    sentences: int
    tokens: int

    def to_json(self) -> dict:
        return dataclasses.asdict(self)


def write_shard(directory: str, index: int, documents: Sequence[Sequence[np.ndarray]],
                vocab_size: int) -> ShardStats:
    """Writes one shard atomically: into a temporary directory, then one rename.

    `documents` is a list of documents, each a list of sentences (int arrays of token ids); empty
    sentences and documents are dropped. A killed writer leaves only a `.tmp-*` directory, which is
    never taken for a shard (and is removed when the shard is written again).
    """
    sentences = [s for doc in documents for s in doc if len(s)]
    doc_sizes = [sum(1 for s in doc if len(s)) for doc in documents]
    doc_sizes = [n for n in doc_sizes if n]
    lengths = np.fromiter((len(s) for s in sentences), np.int64, len(sentences))
    sentence_bounds = np.zeros(len(sentences) + 1, np.int64)
    np.cumsum(lengths, out=sentence_bounds[1:])
    document_bounds = np.zeros(len(doc_sizes) + 1, np.int64)
    np.cumsum(doc_sizes, out=document_bounds[1:])
    dtype = token_dtype(vocab_size)
    tokens = np.concatenate(sentences).astype(dtype) if sentences else np.zeros(0, dtype)
    counts = np.bincount(tokens, minlength=vocab_size).astype(np.int64)
    if len(counts) > vocab_size:
        raise UserError(f"shard {index} has token ids beyond the vocabulary ({vocab_size})")

    final = shard_path(directory, index)
    parent = os.path.dirname(final)
    os.makedirs(parent, exist_ok=True)
    tmp = tempfile.mkdtemp(prefix=f".{shard_name(index)}.tmp-", dir=parent)
    try:
        for name, array in zip(_ARRAYS, (tokens, sentence_bounds, document_bounds, counts)):
            with open(os.path.join(tmp, name + ".npy"), "wb") as f:
                _save_npy(f, array)
                f.flush()
                os.fsync(f.fileno())
        publish(tmp)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return ShardStats(len(doc_sizes), len(sentences), int(lengths.sum()))


def _save_npy(f, array: np.ndarray) -> None:
    """np.save's bytes, written by Python: np.save writes a real file with C's fwrite, whose
    failure (a full disk) surfaces as an OSError without errno that no caller can recognize."""
    array = np.ascontiguousarray(array)
    np.lib.format.write_array_header_1_0(f, np.lib.format.header_data_from_array_1_0(array))
    f.write(array.data)


def remove_partial_shards(directory: str) -> int:
    """Deletes leftovers of killed writers; returns how many there were."""
    parent = os.path.join(directory, SHARDS_DIR)
    if not os.path.isdir(parent):
        return 0
    leftovers = [n for n in os.listdir(parent) if n.startswith(".") and ".tmp-" in n]
    for name in leftovers:
        shutil.rmtree(os.path.join(parent, name), ignore_errors=True)
    return len(leftovers)


def write_manifest(directory: str, shards: Sequence[ShardStats], vocab_size: int,
                   extra: dict | None = None) -> None:
    """The commit point of a preparation: written after every shard, atomically."""
    manifest = {
        "format": FORMAT, "version": VERSION, "vocab_size": vocab_size,
        "token_dtype": token_dtype(vocab_size).name,
        "shards": [dict(name=shard_name(i), **s.to_json()) for i, s in enumerate(shards)],
        "documents": sum(s.documents for s in shards),
        "sentences": sum(s.sentences for s in shards),
        "tokens": sum(s.tokens for s in shards),
        **(extra or {}),
    }
    atomic_files.write_json(os.path.join(directory, MANIFEST), manifest)


def read_manifest(directory: str) -> dict:
    path = os.path.join(directory, MANIFEST)
    if not os.path.exists(path):
        raise UserError(f"{directory} is not a prepared corpus (no {MANIFEST}; was preparation "
                        "interrupted? run it again to finish)")
    try:
        with open(path) as f:
            manifest = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    check_manifest(manifest, path)
    return manifest


def check_manifest(manifest, path: str) -> None:
    if not isinstance(manifest, dict) or manifest.get("format") != FORMAT \
            or manifest.get("version") != VERSION:
        raise UserError(f"{path} is not a {FORMAT} v{VERSION} manifest")


def check_prepared_matches(prepared: str, *, tokenizer_spec: str = "", vocab_size: int | None = None,
                           explicit: bool = True, lowercase: bool | None = None) -> list[str]:
    """Refuses a prepared corpus (or an unfinished preparation) in `prepared` whose vocabulary is
    not the one asked for, instead of letting it silently win; returns warnings where what was
    asked for is only a default. Nothing when `prepared` holds no vocabulary yet.

    `tokenizer_spec` names a vocabulary (vocab.txt, .model, tokenizer directory; loaded with
    `lowercase` when given): the prepared one must be it, token for token. Without one, the
    prepared vocabulary was trained, and `vocab_size` is compared with the size it was trained
    for: a UserError when `explicit` (the user set it), a warning when it is only a default.
    """
    saved = os.path.join(prepared, TOKENIZER_DIR)
    if not os.path.isdir(saved):
        return []
    have = load_tokenizer(saved)
    if tokenizer_spec:
        wanted = load_tokenizer(tokenizer_spec, lowercase=lowercase)
        if not same_vocabulary(have, wanted):
            raise UserError(f"{prepared} was prepared with another vocabulary "
                            f"({_describe(have)}) than {tokenizer_spec} ({_describe(wanted)}); "
                            "nothing was changed: prepare into another directory")
        return []
    trained_for = have.requested_vocab_size or have.vocab_size
    if vocab_size is None or vocab_size == trained_for:
        return []
    mismatch = (f"{prepared} holds a vocabulary trained for {trained_for} tokens, not the "
                f"{vocab_size} asked for")
    if explicit:
        raise UserError(f"{mismatch}; nothing was changed: prepare into another directory, or "
                        "leave the vocabulary size unset to use the one there")
    return [f"{mismatch} by default; using the one there"]


def same_vocabulary(a: Tokenizer, b: Tokenizer) -> bool:
    """Equal ids for every text: the same kind, casing and tokens in the same order."""
    return (a.kind, a.lowercase, a.vocab_size) == (b.kind, b.lowercase, b.vocab_size) and all(
        a.id_to_token(i) == b.id_to_token(i) for i in range(a.vocab_size))


def _describe(tokenizer: Tokenizer) -> str:
    case = "uncased" if tokenizer.lowercase else "cased"
    return f"{tokenizer.kind}, {case}, {tokenizer.vocab_size} tokens"


class PreparedCorpus:
    """All shards of a prepared corpus seen as one: global sentence and document indices.

    `sentence_bounds[s]:sentence_bounds[s+1]` are sentence s's tokens in the virtual concatenation
    of all shards; `document_bounds[d]:document_bounds[d+1]` are document d's sentences.
    """

    reopen_in_workers = True  # worker processes open the directory again (see ExampleSource)

    def __init__(self, shard_tokens: Sequence[np.ndarray], shard_sentence_bounds: Sequence[np.ndarray],
                 shard_document_bounds: Sequence[np.ndarray], token_counts: np.ndarray,
                 tokenizer: Tokenizer | None = None, directory: str | None = None):
        if not shard_tokens:
            raise UserError("the corpus has no shards")
        self.directory = directory
        self.tokenizer = tokenizer
        self.token_counts = np.asarray(token_counts, np.int64)
        self._shard_tokens = list(shard_tokens)
        token_offsets = np.cumsum([0] + [len(t) for t in shard_tokens])
        sentence_offsets = np.cumsum([0] + [len(b) - 1 for b in shard_sentence_bounds])
        self.sentence_bounds = np.concatenate(
            [b[:-1] + off for b, off in zip(shard_sentence_bounds, token_offsets)] + [token_offsets[-1:]]
        ).astype(np.int64)
        self.document_bounds = np.concatenate(
            [b[:-1] + off for b, off in zip(shard_document_bounds, sentence_offsets)]
            + [sentence_offsets[-1:]]).astype(np.int64)
        self._token_offsets = token_offsets
        self.sentence_lengths = np.diff(self.sentence_bounds).astype(np.int32)
        if self.num_documents == 0 or self.num_tokens == 0:
            raise UserError("the corpus is empty: no document has any tokens")

    @classmethod
    def open(cls, directory: str) -> "PreparedCorpus":
        manifest = read_manifest(directory)
        arrays: dict[str, list[np.ndarray]] = {name: [] for name in _ARRAYS}
        for shard in manifest["shards"]:
            path = os.path.join(directory, SHARDS_DIR, shard["name"])
            for name in _ARRAYS:
                file = os.path.join(path, name + ".npy")
                try:
                    arrays[name].append(np.load(file, mmap_mode="r" if name == "tokens" else None))
                except (OSError, ValueError) as e:
                    raise UserError(f"corrupt prepared corpus: cannot read {file}: {e}") from None
        counts = np.sum(arrays["token_counts"], axis=0)
        tokenizer = load_tokenizer(os.path.join(directory, TOKENIZER_DIR))
        if tokenizer.vocab_size != manifest["vocab_size"]:
            raise UserError(f"{directory}: tokenizer has {tokenizer.vocab_size} tokens, the "
                            f"manifest says {manifest['vocab_size']}")
        corpus = cls(arrays["tokens"], arrays["sentence_bounds"], arrays["document_bounds"],
                     counts, tokenizer, directory)
        corpus.manifest = manifest
        return corpus

    @property
    def num_documents(self) -> int:
        return len(self.document_bounds) - 1

    @property
    def num_sentences(self) -> int:
        return len(self.sentence_bounds) - 1

    @property
    def num_tokens(self) -> int:
        return int(self.sentence_bounds[-1])

    def tokens(self, start_sentence: int, end_sentence: int) -> np.ndarray:
        """int32 ids of sentences [start, end), which must not straddle a shard (a document never does)."""
        begin, end = self.sentence_bounds[start_sentence], self.sentence_bounds[end_sentence]
        if end <= begin:
            return np.zeros(0, np.int32)
        shard = int(np.searchsorted(self._token_offsets, begin, side="right")) - 1
        offset = self._token_offsets[shard]
        if end > self._token_offsets[shard + 1]:
            raise ValueError(f"sentences [{start_sentence}, {end_sentence}) straddle shards")
        return np.asarray(self._shard_tokens[shard][begin - offset:end - offset], np.int32)

    def document_sentences(self, document: int) -> tuple[int, int]:
        return int(self.document_bounds[document]), int(self.document_bounds[document + 1])

    def split_documents(self, eval_fraction: float) -> tuple[np.ndarray, np.ndarray]:
        """(train, eval) document indices: every k-th document is held out, deterministically.

        At least one document is held out when eval_fraction > 0, and at least one stays for
        training.
        """
        n = self.num_documents
        if not 0.0 <= eval_fraction < 1.0:
            raise UserError(f"eval_fraction must be in [0, 1), got {eval_fraction}")
        n_eval = 0 if eval_fraction == 0 else min(n - 1, max(1, round(n * eval_fraction)))
        if n_eval == 0:
            return np.arange(n, dtype=np.int64), np.zeros(0, np.int64)
        held = np.unique(np.linspace(0, n - 1, n_eval).round().astype(np.int64))
        is_eval = np.zeros(n, bool)
        is_eval[held] = True
        return np.flatnonzero(~is_eval), np.flatnonzero(is_eval)
