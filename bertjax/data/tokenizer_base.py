"""What every vocabulary kind shares: the five special tokens, their ids, and the Tokenizer
interface. Its own module so that tokenizer.py (WordPiece, SentencePiece and the loader) and
json_tokenizer.py (Hugging Face tokenizer.json) both build on it without importing each other."""

from __future__ import annotations

import abc
import dataclasses
import json
import os
from typing import Iterable, Sequence

import numpy as np

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
