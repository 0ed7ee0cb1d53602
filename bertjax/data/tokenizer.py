"""WordPiece and SentencePiece vocabularies behind one small interface, and the loader for every
kind (Hugging Face tokenizer.json files are json_tokenizer.py's).

All kinds use the same five special tokens. Sequences are built by the data pipeline, so encoding
never adds [CLS]/[SEP] itself. A saved tokenizer is a directory with `tokenizer_config.json` plus
`vocab.txt` (WordPiece, BERT's own format), `spm.model` (SentencePiece) or `tokenizer.json`.
"""

from __future__ import annotations

import json
import os
from typing import Iterable, Sequence

import numpy as np
import sentencepiece as spm
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, processors

from bertjax.core import transfer
from bertjax.core.errors import UserError
from bertjax.data.json_tokenizer import JSON_FILE, BpeTokenizer, JsonTokenizer
# The shared names are imported from here throughout bertjax; they live in tokenizer_base.
from bertjax.data.tokenizer_base import (CLS, CONFIG_FILE, MASK, PAD, SEP, SPECIAL_TOKENS, UNK,
                                         SpecialIds, Tokenizer)

__all__ = ["CLS", "CONFIG_FILE", "MASK", "PAD", "SEP", "SPECIAL_TOKENS", "UNK", "BpeTokenizer",
           "JsonTokenizer", "SentencePieceTokenizer", "SpecialIds", "Tokenizer",
           "WordPieceTokenizer", "load_tokenizer"]


class WordPieceTokenizer(Tokenizer):
    """BERT's tokenizer: BertNormalizer + BertPreTokenizer + WordPiece, via Hugging Face tokenizers."""

    kind = "wordpiece"

    def __init__(self, vocab: Sequence[str], lowercase: bool = True):
        if len(set(vocab)) != len(vocab):
            raise UserError("the vocabulary has duplicate tokens")
        missing = [t for t in SPECIAL_TOKENS if t not in vocab]
        if missing:
            raise UserError(f"the vocabulary lacks the special tokens {' '.join(missing)}")
        self._vocab = list(vocab)
        self.lowercase = lowercase
        self._build()

    def _build(self) -> None:
        index = {token: i for i, token in enumerate(self._vocab)}
        tok = HFTokenizer(models.WordPiece(vocab=index, unk_token=UNK, max_input_chars_per_word=100))
        # strip_accents=None follows `lowercase`, exactly as BERT's BasicTokenizer does.
        tok.normalizer = normalizers.BertNormalizer(
            clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=self.lowercase)
        tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tok.decoder = decoders.WordPiece(prefix="##")
        self._tok = tok
        self._index = index
        self.special = SpecialIds(*(index[t] for t in SPECIAL_TOKENS))

    def to_json(self) -> str:
        """This vocabulary as a fast tokenizer's tokenizer.json, as transformers' BERT tokenizer
        writes it: the special tokens registered, [CLS] A [SEP] (B [SEP]) added around text."""
        tok = HFTokenizer.from_str(self._tok.to_str())
        tok.add_special_tokens(list(SPECIAL_TOKENS))
        tok.post_processor = processors.TemplateProcessing(
            single=f"{CLS} $A {SEP}", pair=f"{CLS} $A {SEP} $B:1 {SEP}:1",
            special_tokens=[(CLS, self.special.cls), (SEP, self.special.sep)])
        return tok.to_str()

    def __getstate__(self):
        return {"vocab": self._vocab, "lowercase": self.lowercase}

    def __setstate__(self, state):
        self._vocab, self.lowercase = state["vocab"], state["lowercase"]
        self._build()

    @property
    def vocab_size(self) -> int:
        return len(self._vocab)

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        encodings = self._tok.encode_batch(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, np.int32) for e in encodings]

    def id_to_token(self, token_id: int) -> str:
        return self._vocab[token_id]

    def token_to_id(self, token: str) -> int | None:
        return self._index.get(token)

    def word_start_mask(self) -> np.ndarray:
        return np.array([not t.startswith("##") for t in self._vocab], bool)

    def decode(self, ids: Iterable[int]) -> str:
        return " ".join(self.tokens(ids)).replace(" ##", "")

    def save(self, directory: str) -> None:
        self._write_config(directory, vocab_file="vocab.txt")
        with open(os.path.join(directory, "vocab.txt"), "w", encoding="utf-8") as f:
            f.writelines(token + "\n" for token in self._vocab)

    @classmethod
    def from_vocab_file(cls, path: str, lowercase: bool = True) -> "WordPieceTokenizer":
        try:
            with open(path, encoding="utf-8") as f:
                vocab = [line.rstrip("\r\n") for line in f]
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"cannot read vocabulary {path}: {e}") from None
        while vocab and not vocab[-1]:
            vocab.pop()
        return cls(vocab, lowercase=lowercase)


class SentencePieceTokenizer(Tokenizer):
    """A SentencePiece model whose reserved pieces are our five special tokens (ids 0-4)."""

    kind = "sentencepiece"

    def __init__(self, model_proto: bytes, lowercase: bool = True):
        self._proto = model_proto
        self.lowercase = lowercase
        self._build()

    def _build(self) -> None:
        self._sp = spm.SentencePieceProcessor()
        try:
            self._sp.LoadFromSerializedProto(self._proto)
        except RuntimeError as e:
            raise UserError(f"not a SentencePiece model: {e}") from None
        ids = [self._sp.piece_to_id(t) for t in SPECIAL_TOKENS]
        unknown = self._sp.unk_id()
        if ids[0] == unknown and self._sp.pad_id() >= 0:  # the model's own pad piece (<pad>)
            ids[0] = self._sp.pad_id()
        missing = [t for t, i in zip(SPECIAL_TOKENS, ids) if i == unknown and t != UNK]
        if missing:
            raise UserError(f"the SentencePiece model lacks the special pieces {' '.join(missing)}")
        ids[1] = unknown
        self.special = SpecialIds(*ids)

    def __getstate__(self):
        return {"proto": self._proto, "lowercase": self.lowercase}

    def __setstate__(self, state):
        self._proto, self.lowercase = state["proto"], state["lowercase"]
        self._build()

    @property
    def vocab_size(self) -> int:
        return self._sp.get_piece_size()

    @property
    def model_proto(self) -> bytes:
        """The serialized SentencePiece model (what a .model file holds)."""
        return self._proto

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        if self.lowercase:
            texts = [t.lower() for t in texts]
        return [np.asarray(ids, np.int32) for ids in self._sp.encode(list(texts), out_type=int)]

    def id_to_token(self, token_id: int) -> str:
        return self._sp.id_to_piece(int(token_id))

    def token_to_id(self, token: str) -> int | None:
        i = self._sp.piece_to_id(token)
        return None if i == self._sp.unk_id() and token != UNK else i

    def word_start_mask(self) -> np.ndarray:
        pieces = [self._sp.id_to_piece(i) for i in range(self.vocab_size)]
        return np.array([p.startswith("\u2581") for p in pieces], bool) | self.special_mask()

    def decode(self, ids: Iterable[int]) -> str:
        return "".join(self.tokens(ids)).replace("\u2581", " ").strip()

    def save(self, directory: str) -> None:
        self._write_config(directory, model_file="spm.model")
        with open(os.path.join(directory, "spm.model"), "wb") as f:
            f.write(self._proto)

    @classmethod
    def from_model_file(cls, path: str, lowercase: bool = True) -> "SentencePieceTokenizer":
        try:
            with open(path, "rb") as f:
                return cls(f.read(), lowercase=lowercase)
        except OSError as e:
            raise UserError(f"cannot read SentencePiece model {path}: {e}") from None


def load_tokenizer(path: str, lowercase: bool | None = None) -> Tokenizer:
    """Loads a saved tokenizer directory, a BERT `vocab.txt`, a SentencePiece `.model` file, or a
    Hugging Face `tokenizer.json` (or a directory holding one, as `save_pretrained` writes it).

    `lowercase` overrides what a directory's config says (a bare vocab.txt defaults to uncased);
    a tokenizer.json ignores it, since its own normalizer decides (and `data.lowercase` is on by
    default). A URL (gs://...) is read from this host's cached copy of it.
    """
    path = transfer.local_copy(path)
    if os.path.isdir(path):
        return _load_directory(path, lowercase)
    if not os.path.exists(path):
        raise UserError(f"tokenizer not found: {path}")
    case = True if lowercase is None else lowercase
    if path.endswith(".model"):
        return SentencePieceTokenizer.from_model_file(path, case)
    if path.endswith(".json"):
        return JsonTokenizer.from_file(path)
    return WordPieceTokenizer.from_vocab_file(path, case)


def _load_directory(path: str, lowercase: bool | None) -> Tokenizer:
    config_path = os.path.join(path, CONFIG_FILE)
    config: dict = {}
    if os.path.exists(config_path):
        with open(config_path) as f:
            config = json.load(f)
    kind = config.get("type")  # absent from transformers' own tokenizer_config.json
    case = config.get("lowercase", True) if lowercase is None else lowercase
    vocab_file = os.path.join(path, config.get("vocab_file", "vocab.txt"))
    if kind in ("json", "bpe"):
        json_class = BpeTokenizer if kind == "bpe" else JsonTokenizer
        tokenizer: Tokenizer = json_class.from_file(
            os.path.join(path, config.get("tokenizer_file", JSON_FILE)))
    elif kind == "sentencepiece" or os.path.exists(os.path.join(path, "spm.model")):
        tokenizer = SentencePieceTokenizer.from_model_file(os.path.join(path, "spm.model"), case)
    elif os.path.exists(vocab_file):
        tokenizer = WordPieceTokenizer.from_vocab_file(vocab_file, case)
    elif kind is None and os.path.exists(os.path.join(path, JSON_FILE)):
        tokenizer = JsonTokenizer.from_file(os.path.join(path, JSON_FILE))
    else:
        raise UserError(f"{path} holds no tokenizer (no vocab.txt, spm.model or {JSON_FILE})")
    tokenizer.requested_vocab_size = config.get("requested_vocab_size")
    return tokenizer
