"""Span classification features: `[CLS] text [SEP]`, the span as its first and last token.

Character offsets become token positions through each token's own characters: the text is split
into words with offsets (BERT's pre-tokenization, as for QA), each word is tokenized on its own,
and a word's subwords get consecutive slices of its characters (a WordPiece piece without "##",
a SentencePiece piece without its leading "\u2581"). Where the pieces do not spell the word out
(an [UNK], normalization that changes the length) every piece of the word gets the whole word.
A span's tokens are those whose characters overlap [start, end).

A span whose last token falls beyond max_seq_len, or that covers no token (only spaces), has no
row: it is counted and skipped (its prediction is empty); `Features.example` maps rows back.
"""

from __future__ import annotations

import collections
from typing import Sequence

import numpy as np

from bertjax.data.tokenizer import Tokenizer
from bertjax.finetune.features import Features, _pad, context_words
from bertjax.finetune.examples import SpanExample

Offsets = list[tuple[int, int]]
BEYOND = "span(s) skipped: beyond max_seq_len"
EMPTY = "span(s) skipped: no token in the span (only spaces)"


def _piece_text(token: str) -> str:
    if token.startswith("##"):
        return token[2:]
    return token[1:] if token.startswith("\u2581") else token


def piece_offsets(tokenizer: Tokenizer, ids: Sequence[int], start: int, end: int) -> Offsets:
    """The characters of each piece of the word at [start, end)."""
    lengths = [len(_piece_text(tokenizer.id_to_token(i))) for i in ids]
    if tokenizer.special.unk in ids or sum(lengths) != end - start:
        return [(start, end)] * len(ids)
    ends = start + np.cumsum(lengths)
    return [(int(e - n), int(e)) for e, n in zip(ends, lengths)]


def tokenize_with_offsets(tokenizer: Tokenizer, text: str) -> tuple[list[int], Offsets]:
    """The text's token ids (no special tokens) and each token's [start, end) characters."""
    words = context_words(text)
    pieces = tokenizer.encode_batch([w for w, _ in words]) if words else []
    ids, offsets = [], []
    for (_, (a, b)), word_ids in zip(words, pieces):
        word_ids = word_ids.tolist() or [tokenizer.special.unk]
        ids += word_ids
        offsets += piece_offsets(tokenizer, word_ids, a, b)
    return ids, offsets


def span_tokens(offsets: Offsets, start: int, end: int) -> tuple[int, int] | None:
    """(first, last) token overlapping characters [start, end), or None."""
    hit = [i for i, (a, b) in enumerate(offsets) if a < end and b > start]
    return (hit[0], hit[-1]) if hit else None


def encode_spans(tokenizer: Tokenizer, examples: Sequence[SpanExample], max_seq_len: int,
                 labels: np.ndarray) -> Features:
    """Features with `span_start` / `span_end` (inclusive token positions in the row)."""
    cached: dict[str, tuple[list[int], Offsets]] = {}
    rows, spans, kept = [], [], []
    counts = collections.Counter()
    for index, example in enumerate(examples):
        if example.text not in cached:
            cached[example.text] = tokenize_with_offsets(tokenizer, example.text)
        ids, offsets = cached[example.text]
        found = span_tokens(offsets, example.start, example.end)
        if found is None:
            counts[EMPTY] += 1
            continue
        if found[1] + 2 > max_seq_len:  # [CLS] before, [SEP] after
            counts[BEYOND] += 1
            continue
        body = ids[:max_seq_len - 2]
        rows.append([tokenizer.special.cls, *body, tokenizer.special.sep])
        spans.append((found[0] + 1, found[1] + 1))
        kept.append(index)
    n = len(rows)
    positions = np.asarray(spans, np.int32).reshape(n, 2)
    arrays = {"input_ids": _pad(rows, max_seq_len),
              "segment_ids": np.zeros((n, max_seq_len), np.int32),
              "input_mask": _pad([[1] * len(r) for r in rows], max_seq_len),
              "span_start": positions[:, 0], "span_end": positions[:, 1],
              "label": np.asarray(labels)[np.asarray(kept, np.int64)].astype(np.int32),
              "weight": np.ones(n, np.float32)}
    return Features(arrays, counts, example=np.asarray(kept, np.int64))
