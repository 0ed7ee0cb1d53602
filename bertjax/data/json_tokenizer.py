"""A Hugging Face `tokenizer.json` (ModernBERT's BPE, RoBERTa's, or any other) as a Tokenizer.

The file is used as it is: its normalizer, pre-tokenizer and model decide the ids, so `lowercase`
reports what the normalizer does rather than adding lowercasing. Two things differ from calling
the file directly, both because the data pipeline builds the sequences itself: [CLS]/[SEP] are
never added (the file's post-processor is not run), and special tokens spelled out in raw text
stay text ("[MASK]" in a corpus is not the mask token), as with the WordPiece tokenizer. Any
truncation or padding the file enables is switched off. A saved one is a directory with
`tokenizer.json` (the file unchanged) and `tokenizer_config.json` (type "json", or "bpe" for one
trained here).

The five special roles are found by name: BERT's [PAD] [UNK] [CLS] [SEP] [MASK] first, else
RoBERTa's <pad> <unk> <s> </s> <mask>.

Word starts (whole-word and span masking) follow how the vocabulary marks words:
  - WordPiece model: a token not starting with its continuing-subword prefix ("##");
  - a ByteLevel pre-tokenizer (GPT-2, RoBERTa, ModernBERT): a token starting with "Ġ", the
    encoded space (so without add_prefix_space a text's first word is not a start);
  - a Metaspace pre-tokenizer (SentencePiece-style): a token starting with its replacement "▁";
  - a BPE model with a continuing-subword prefix: a token not starting with it;
  - otherwise every token starts a word (whole-word masking then masks single tokens).
Added tokens (the specials among them) always count as word starts: they are matched whole, before
pre-tokenization.
"""

from __future__ import annotations

import json
import os
from typing import Callable, Iterable, Sequence

import numpy as np
from tokenizers import Tokenizer as HFTokenizer

from bertjax.core.errors import UserError
from bertjax.data.tokenizer_base import SPECIAL_TOKENS, SpecialIds, Tokenizer

JSON_FILE = "tokenizer.json"
ROBERTA_TOKENS = ("<pad>", "<unk>", "<s>", "</s>", "<mask>")
_ROLES = ("pad", "unk", "cls", "sep", "mask")
BYTE_LEVEL_SPACE = "\u0120"  # "Ġ": ByteLevel's stand-in for the space byte


def _one_line(error: Exception) -> str:
    return " ".join(str(error).split())


def _find_special_ids(tok: HFTokenizer, source: str) -> SpecialIds:
    ids, missing = [], []
    for role, bert, roberta in zip(_ROLES, SPECIAL_TOKENS, ROBERTA_TOKENS):
        found = tok.token_to_id(bert)
        found = tok.token_to_id(roberta) if found is None else found
        ids.append(found)
        if found is None:
            missing.append(f"{role} ({bert} or {roberta})")
    if missing:
        raise UserError(f"{source} lacks the special tokens for {', '.join(missing)}")
    return SpecialIds(*ids)


def _components(node: dict | None, sequence_key: str) -> list[dict]:
    """A normalizer or pre-tokenizer and, for a Sequence, the ones it holds."""
    if not node:
        return []
    if node.get("type") == "Sequence":
        return [part for child in node.get(sequence_key) or [] for part in
                _components(child, sequence_key)]
    return [node]


def _lowercases(config: dict) -> bool:
    return any(n.get("type") == "Lowercase" or (n.get("type") == "BertNormalizer"
                                                and n.get("lowercase"))
               for n in _components(config.get("normalizer"), "normalizers"))


def _word_start_rule(config: dict) -> Callable[[str], bool]:
    """How a token shows that it begins a word; the module docstring gives the order."""
    model = config.get("model") or {}
    pre = _components(config.get("pre_tokenizer"), "pretokenizers")
    prefix = model.get("continuing_subword_prefix")
    if model.get("type") == "WordPiece":
        prefix = prefix or "##"
        return lambda token: not token.startswith(prefix)
    if any(p.get("type") == "ByteLevel" for p in pre):
        return lambda token: token.startswith(BYTE_LEVEL_SPACE)
    metaspace = [p.get("replacement") or "\u2581" for p in pre if p.get("type") == "Metaspace"]
    if metaspace:
        return lambda token: token.startswith(metaspace[0])
    if prefix:
        return lambda token: not token.startswith(prefix)
    return lambda token: True


class JsonTokenizer(Tokenizer):
    """A `tokenizers.Tokenizer` read from its JSON serialization (see the module docstring)."""

    kind = "json"

    def __init__(self, json_text: str, source: str = JSON_FILE):
        self._json = json_text
        self._source = source
        self._build()

    def _build(self) -> None:
        try:
            config = json.loads(self._json)
            tok = HFTokenizer.from_str(self._json)
        except Exception as e:  # tokenizers raises a bare Exception for a file it cannot read
            raise UserError(f"{self._source} is not a Hugging Face tokenizer.json: "
                            f"{_one_line(e)}") from None
        tok.no_truncation()
        tok.no_padding()
        tok.encode_special_tokens = True
        self._tok = tok
        self.special = _find_special_ids(tok, self._source)
        self.lowercase = _lowercases(config)
        self._starts = _word_start_rule(config)
        vocab = tok.get_vocab(with_added_tokens=True)
        # Added tokens may sit past gaps in the ids; the embedding table must cover the largest.
        self._size = max(vocab.values()) + 1
        self._added = list(tok.get_added_tokens_decoder())

    def __getstate__(self):
        return {"json": self._json, "source": self._source,
                "requested_vocab_size": self.requested_vocab_size}

    def __setstate__(self, state):
        self._json, self._source = state["json"], state["source"]
        self.requested_vocab_size = state["requested_vocab_size"]
        self._build()

    @property
    def vocab_size(self) -> int:
        return self._size

    def encode_batch(self, texts: Sequence[str]) -> list[np.ndarray]:
        encodings = self._tok.encode_batch(list(texts), add_special_tokens=False)
        return [np.asarray(e.ids, np.int32) for e in encodings]

    def id_to_token(self, token_id: int) -> str:
        """The token; "" for an id in a gap of the vocabulary."""
        return self._tok.id_to_token(int(token_id)) or ""

    def token_to_id(self, token: str) -> int | None:
        return self._tok.token_to_id(token)

    def word_start_mask(self) -> np.ndarray:
        tokens = [self.id_to_token(i) for i in range(self._size)]
        mask = np.array([bool(t) and self._starts(t) for t in tokens], bool)
        mask[self._added] = True
        return mask | self.special_mask()

    def decode(self, ids: Iterable[int]) -> str:
        return self._tok.decode([int(i) for i in ids], skip_special_tokens=False).strip()

    def to_json(self) -> str:
        """The tokenizer.json text this tokenizer was read from."""
        return self._json

    def save(self, directory: str) -> None:
        self._write_config(directory, tokenizer_file=JSON_FILE)
        with open(os.path.join(directory, JSON_FILE), "w", encoding="utf-8") as f:
            f.write(self._json)

    @classmethod
    def from_file(cls, path: str) -> "JsonTokenizer":
        try:
            with open(path, encoding="utf-8") as f:
                return cls(f.read(), source=path)
        except (OSError, UnicodeDecodeError) as e:
            raise UserError(f"cannot read tokenizer {path}: {_one_line(e)}") from None


class BpeTokenizer(JsonTokenizer):
    """A byte-level BPE trained by tokenizer_training.train_bpe: a tokenizer.json all the same, of
    its own kind so that asking to train a "bpe" again recognizes the one trained earlier."""

    kind = "bpe"
