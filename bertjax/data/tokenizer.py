"""WordPiece and SentencePiece vocabularies behind one small interface.

Both kinds use the same five special tokens. Sequences are built by the data pipeline, so encoding
never adds [CLS]/[SEP] itself. A saved tokenizer is a directory with `tokenizer_config.json` plus
`vocab.txt` (WordPiece, BERT's own format) or `spm.model` (SentencePiece).
"""

from __future__ import annotations

import abc
import dataclasses
import io
import json
import os
from typing import Iterable, Sequence

import numpy as np

from bertjax.errors import UserError

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
        from tokenizers import Tokenizer as HFTokenizer
        from tokenizers import decoders, models, normalizers, pre_tokenizers

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
        import sentencepiece as spm

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


def _check_vocab_size(vocab_size: int) -> None:
    if vocab_size <= len(SPECIAL_TOKENS):
        raise UserError(f"vocab_size {vocab_size} must exceed the {len(SPECIAL_TOKENS)} special tokens")


def train_wordpiece(texts: Iterable[str], vocab_size: int = 30522, lowercase: bool = True,
                    min_frequency: int = 2, limit_alphabet: int = 1000) -> WordPieceTokenizer:
    """Learns a WordPiece vocabulary; the special tokens take ids 0-4."""
    from tokenizers import Tokenizer as HFTokenizer
    from tokenizers import models, normalizers, pre_tokenizers, trainers

    _check_vocab_size(vocab_size)
    tok = HFTokenizer(models.WordPiece(unk_token=UNK))
    tok.normalizer = normalizers.BertNormalizer(
        clean_text=True, handle_chinese_chars=True, strip_accents=None, lowercase=lowercase)
    tok.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, limit_alphabet=limit_alphabet,
        special_tokens=list(SPECIAL_TOKENS), continuing_subword_prefix="##", show_progress=False)
    tok.train_from_iterator(texts, trainer=trainer)
    learned = set(tok.get_vocab()) - set(SPECIAL_TOKENS)
    if not learned:
        raise UserError("the corpus is empty: no vocabulary could be learned from it")
    # The trainer breaks ties between equally frequent merges in hash-map order, which changes
    # from run to run: the same corpus gives the same tokens under shuffled ids. WordPiece only
    # uses the set of tokens, so a sorted order makes the ids reproducible.
    return WordPieceTokenizer(list(SPECIAL_TOKENS) + sorted(learned), lowercase=lowercase)


def train_sentencepiece(texts: Iterable[str], vocab_size: int = 30522, lowercase: bool = True,
                        character_coverage: float = 0.9995,
                        max_sentences: int = 10_000_000) -> SentencePieceTokenizer:
    """Learns a unigram SentencePiece model; [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4."""
    import sentencepiece as spm

    _check_vocab_size(vocab_size)
    lowered = (t.lower() if lowercase else t for t in texts)
    nonempty = (t for t in lowered if t.strip())
    model = io.BytesIO()
    try:
        spm.SentencePieceTrainer.train(
            sentence_iterator=nonempty, model_writer=model, vocab_size=vocab_size,
            model_type="unigram", character_coverage=character_coverage,
            pad_id=0, unk_id=1, bos_id=-1, eos_id=-1, pad_piece=PAD, unk_piece=UNK,
            user_defined_symbols=[CLS, SEP, MASK], input_sentence_size=max_sentences,
            shuffle_input_sentence=True, hard_vocab_limit=False, minloglevel=2)
    except RuntimeError as e:
        raise UserError(f"SentencePiece training failed: {' '.join(str(e).split())}") from None
    return SentencePieceTokenizer(model.getvalue(), lowercase=lowercase)


def load_tokenizer(path: str, lowercase: bool | None = None) -> Tokenizer:
    """Loads a saved tokenizer directory, a BERT `vocab.txt`, or a SentencePiece `.model` file.

    `lowercase` overrides what a directory's config says (a bare vocab.txt defaults to uncased).
    """
    if os.path.isdir(path):
        config_path = os.path.join(path, CONFIG_FILE)
        config: dict = {}
        if os.path.exists(config_path):
            with open(config_path) as f:
                config = json.load(f)
        case = config.get("lowercase", True) if lowercase is None else lowercase
        if config.get("type") == "sentencepiece" or os.path.exists(os.path.join(path, "spm.model")):
            return SentencePieceTokenizer.from_model_file(os.path.join(path, "spm.model"), case)
        vocab_file = os.path.join(path, config.get("vocab_file", "vocab.txt"))
        if not os.path.exists(vocab_file):
            raise UserError(f"{path} holds no tokenizer (no vocab.txt or spm.model)")
        return WordPieceTokenizer.from_vocab_file(vocab_file, case)
    if not os.path.exists(path):
        raise UserError(f"tokenizer not found: {path}")
    case = True if lowercase is None else lowercase
    if path.endswith(".model"):
        return SentencePieceTokenizer.from_model_file(path, case)
    return WordPieceTokenizer.from_vocab_file(path, case)
