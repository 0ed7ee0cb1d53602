"""WordPiece and SentencePiece vocabularies behind one small interface.

Both kinds use the same five special tokens. Sequences are built by the data pipeline, so encoding
never adds [CLS]/[SEP] itself. A saved tokenizer is a directory with `tokenizer_config.json` plus
`vocab.txt` (WordPiece, BERT's own format) or `spm.model` (SentencePiece).
"""

from __future__ import annotations

import abc
import dataclasses
import json
import os
from typing import Iterable, Sequence

import numpy as np
import sentencepiece as spm
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers

from bertjax.core import transfer
from bertjax.core.errors import UserError

PAD, UNK, CLS, SEP, MASK = "[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]"
SPECIAL_TOKENS = (PAD, UNK, CLS, SEP, MASK)
CONFIG_FILE = "tokenizer_config.json"


@dataclasses.dataclass(frozen=True)
class SpecialIds:
    pad: int
    unk: int
    cls: int
    sep: int
    mask: int

    def as_array(self) -> np.ndarray:
        return np.array([self.pad, self.unk, self.cls, self.sep, self.mask], np.int32)


class Tokenizer(abc.ABC):
    """Text <-> ids. Subclasses are picklable so preparation workers can carry them."""

    kind: str
    lowercase: bool
    special: SpecialIds
    # The size a trained vocabulary was asked for (it may come out smaller on a small corpus);
    # saved with it, so that a later request can be compared with the request, not the outcome.
    requested_vocab_size: int | None = None

    @property
    @abc.abstractmethod
    def vocab_size(self) -> int: ...

    @abc.abstractmethod
    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        """One int32 array of ids per text, without special tokens."""

    @abc.abstractmethod
    def id_to_token(self, token_id: int) -> str: ...

    @abc.abstractmethod
    def token_to_id(self, token: str) -> int | None: ...

    @abc.abstractmethod
    def word_start_mask(self) -> np.ndarray:
        """bool[vocab_size]: True where a token begins a word (whole-word and span masking)."""

    @abc.abstractmethod
    def decode(self, ids: Iterable[int]) -> str:
        """Readable text; special tokens are kept so masked examples can be inspected."""

    @abc.abstractmethod
    def save(self, directory: str) -> None: ...

    def encode(self, text: str) -> np.ndarray:
        return self.encode_batch([text])[0]

    def tokens(self, ids: Iterable[int]) -> list[str]:
        return [self.id_to_token(int(i)) for i in ids]

    def special_mask(self) -> np.ndarray:
        """bool[vocab_size]: True for the five special tokens."""
        mask = np.zeros(self.vocab_size, bool)
        mask[self.special.as_array()] = True
        return mask

    def _write_config(self, directory: str, **extra) -> None:
        os.makedirs(directory, exist_ok=True)
        config = {"type": self.kind, "lowercase": self.lowercase, **extra}
        if self.requested_vocab_size is not None:
            config["requested_vocab_size"] = self.requested_vocab_size
        with open(os.path.join(directory, CONFIG_FILE), "w") as f:
            json.dump(config, f, indent=2)


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
    """Loads a saved tokenizer directory, a BERT `vocab.txt`, or a SentencePiece `.model` file.

    `lowercase` overrides what a directory's config says (a bare vocab.txt defaults to uncased).
    A URL (gs://...) is read from this host's cached copy of it.
    """
    path = transfer.local_copy(path)
    if os.path.isdir(path):
        config_path = os.path.join(path, CONFIG_FILE)
        config: dict = {}
        if os.path.exists(config_path):
            with open(config_path) as f:
                config = json.load(f)
        case = config.get("lowercase", True) if lowercase is None else lowercase
        if config.get("type") == "sentencepiece" or os.path.exists(os.path.join(path, "spm.model")):
            tokenizer = SentencePieceTokenizer.from_model_file(os.path.join(path, "spm.model"), case)
        else:
            vocab_file = os.path.join(path, config.get("vocab_file", "vocab.txt"))
            if not os.path.exists(vocab_file):
                raise UserError(f"{path} holds no tokenizer (no vocab.txt or spm.model)")
            tokenizer = WordPieceTokenizer.from_vocab_file(vocab_file, case)
        tokenizer.requested_vocab_size = config.get("requested_vocab_size")
        return tokenizer
    if not os.path.exists(path):
        raise UserError(f"tokenizer not found: {path}")
    case = True if lowercase is None else lowercase
    if path.endswith(".model"):
        return SentencePieceTokenizer.from_model_file(path, case)
    return WordPieceTokenizer.from_vocab_file(path, case)
