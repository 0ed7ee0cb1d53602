"""Learning a vocabulary: WordPiece, SentencePiece or byte-level BPE, from texts or from a corpus'
sources."""

from __future__ import annotations

import io
import itertools
from typing import Iterable, Sequence

import sentencepiece as spm
from tokenizers import Tokenizer as HFTokenizer
from tokenizers import decoders, models, normalizers, pre_tokenizers, trainers

from bertjax.data.inputs import resolve_inputs
from bertjax.data.json_tokenizer import BpeTokenizer
from bertjax.data.sources import DEFAULT_MAX_LINE_CHARS, iter_documents
from bertjax.data.tokenizer import (CLS, MASK, PAD, SEP, SPECIAL_TOKENS, UNK,
                                    SentencePieceTokenizer, Tokenizer, WordPieceTokenizer)
from bertjax.core.errors import UserError

TOKENIZER_KINDS = ("wordpiece", "sentencepiece", "bpe")


def _check_vocab_size(vocab_size: int) -> None:
    if vocab_size <= len(SPECIAL_TOKENS):
        raise UserError(f"vocab_size {vocab_size} must exceed the {len(SPECIAL_TOKENS)} special tokens")


def train_wordpiece(texts: Iterable[str], vocab_size: int = 30522, lowercase: bool = True,
                    min_frequency: int = 2, limit_alphabet: int = 1000) -> WordPieceTokenizer:
    """Learns a WordPiece vocabulary; the special tokens take ids 0-4."""
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
    tokenizer = WordPieceTokenizer(list(SPECIAL_TOKENS) + sorted(learned), lowercase=lowercase)
    tokenizer.requested_vocab_size = vocab_size
    return tokenizer


def train_sentencepiece(texts: Iterable[str], vocab_size: int = 30522, lowercase: bool = True,
                        character_coverage: float = 0.9995,
                        max_sentences: int = 10_000_000) -> SentencePieceTokenizer:
    """Learns a unigram SentencePiece model; [PAD]=0, [UNK]=1, [CLS]=2, [SEP]=3, [MASK]=4."""
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
    tokenizer = SentencePieceTokenizer(model.getvalue(), lowercase=lowercase)
    tokenizer.requested_vocab_size = vocab_size
    return tokenizer


def train_bpe(texts: Iterable[str], vocab_size: int = 30522, lowercase: bool = True,
              min_frequency: int = 2) -> BpeTokenizer:
    """Learns a byte-level BPE (GPT-2/RoBERTa/ModernBERT style); the special tokens take ids 0-4.

    Every byte is in the vocabulary, so [UNK] never appears. Lowercasing is a Lowercase
    normalizer in the tokenizer.json (accents are kept, unlike BERT's uncased WordPiece).
    """
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    floor = len(alphabet) + len(SPECIAL_TOKENS)
    if vocab_size <= floor:
        raise UserError(f"vocab_size {vocab_size} must exceed the {floor} tokens a byte-level BPE "
                        f"starts with ({len(alphabet)} bytes and {len(SPECIAL_TOKENS)} special)")
    tok = HFTokenizer(models.BPE(unk_token=UNK))
    if lowercase:
        tok.normalizer = normalizers.Lowercase()
    # The pipeline encodes each sentence on its own: with a prefix space a sentence's first word
    # gets the same tokens (and word start) as it would mid-text.
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, min_frequency=min_frequency, initial_alphabet=alphabet,
        special_tokens=list(SPECIAL_TOKENS), show_progress=False)
    texts = iter(texts)
    first = next((text for text in texts if text.strip()), None)
    if first is None:
        raise UserError("the corpus is empty: no vocabulary could be learned from it")
    tok.train_from_iterator(itertools.chain([first], texts), trainer=trainer)
    tokenizer = BpeTokenizer(tok.to_str())
    tokenizer.requested_vocab_size = vocab_size
    return tokenizer


def build_tokenizer(inputs: Sequence[str], input_format: str, kind: str = "wordpiece",
                    vocab_size: int = 30522, lowercase: bool = True,
                    max_sentences: int = 10_000_000,
                    max_line_chars: int = DEFAULT_MAX_LINE_CHARS) -> Tokenizer:
    """Trains a tokenizer on the first `max_sentences` sentences of the sources, streamed."""
    if kind not in TOKENIZER_KINDS:
        raise UserError(f"unknown tokenizer kind {kind!r}; expected one of "
                        f"{', '.join(TOKENIZER_KINDS)}")
    if max_sentences < 1:
        raise UserError(f"max_sentences must be positive, got {max_sentences}")
    documents = iter_documents(resolve_inputs(inputs), input_format, max_line_chars=max_line_chars)
    sentences = (sentence for document in documents for sentence in document)
    # Pull the first sentence here so an empty corpus raises UserError in Python, not mid-training.
    first = next(sentences)
    sample = itertools.islice(itertools.chain([first], sentences), max_sentences)
    if kind == "wordpiece":
        return train_wordpiece(sample, vocab_size=vocab_size, lowercase=lowercase)
    if kind == "bpe":
        return train_bpe(sample, vocab_size=vocab_size, lowercase=lowercase)
    return train_sentencepiece(sample, vocab_size=vocab_size, lowercase=lowercase,
                               max_sentences=max_sentences)
