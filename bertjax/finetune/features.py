"""Examples -> fixed-shape numpy features: [CLS] A [SEP] (B [SEP]), padded to `max_seq_len`.

Every feature set carries `weight` [N] (1 for a real row); batches are completed with zero-weight
rows, so shapes stay static and padding never counts in a loss or a metric.

Token classification: each word is tokenized on its own; its tag goes on its first subword, and,
with `all_subwords`, on its other subwords too (B-X continues as I-X, so the expanded sequence is
still valid BIO). `label_mask` marks the positions that carry a tag (the chain a CRF runs over);
predictions are read back from each word's first subword. The sequence stops at the first word
that does not fit: it and every later word are cut (counted, predicted O), so the kept words are
always a prefix of the example's words.

Extractive QA: `[CLS] question [SEP] window [SEP]` over windows of the context taken every
`doc_stride` tokens (BERT's run_squad). The context is split into words with character offsets
(BERT's pre-tokenization: whitespace and punctuation), so an answer is cut from the original text.
Training keeps only windows that hold the whole answer (the softmax runs over context tokens only,
so there is no [CLS] target for the others); an answer that is not at its stated offset in the
context is a counted skip.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Sequence

import numpy as np
from tokenizers.pre_tokenizers import BertPreTokenizer

from bertjax.data.tokenizer import Tokenizer
from bertjax.finetune.examples import QAExample, TaggedExample, TextExample

Arrays = dict[str, np.ndarray]


@dataclasses.dataclass
class Features:
    arrays: Arrays  # every array has the same leading size
    counts: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    # Token classification: per row, the positions of the words' first subwords (kept words).
    word_starts: list[np.ndarray] | None = None
    # QA: per row, its example index, the word of each position (-1 off the context), and
    # whether this window is the one where that token has the most context.
    windows: "QAWindows | None" = None
    # Span classification: the example of each row (examples whose span does not fit have none).
    example: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.arrays["weight"])


@dataclasses.dataclass
class QAWindows:
    example: np.ndarray  # [N] int
    token_word: np.ndarray  # [N, L] int, -1 outside the context
    max_context: np.ndarray  # [N, L] bool (all False in training features: unused there)
    word_offsets: list[list[tuple[int, int]]]  # per example: (start, end) character offsets


def _pad(rows: Sequence[Sequence[int]], length: int, dtype=np.int32) -> np.ndarray:
    out = np.zeros((len(rows), length), dtype)
    for i, row in enumerate(rows):
        out[i, :len(row)] = row
    return out


def assemble(tokenizer: Tokenizer, first: np.ndarray, second: np.ndarray | None
              ) -> tuple[list[int], list[int]]:
    s = tokenizer.special
    ids = [s.cls, *first.tolist(), s.sep]
    segments = [0] * len(ids)
    if second is not None:
        ids += [*second.tolist(), s.sep]
        segments += [1] * (len(second) + 1)
    return ids, segments


def truncate_pair(a: np.ndarray, b: np.ndarray | None, budget: int
                   ) -> tuple[np.ndarray, np.ndarray | None, bool]:
    """BERT's _truncate_seq_pair: drop the last token of the longer side until both fit."""
    if b is None:
        return a[:budget], None, len(a) > budget
    la, lb = len(a), len(b)
    while la + lb > budget:
        if la > lb:
            la -= 1
        else:
            lb -= 1
    return a[:la], b[:lb], (la, lb) != (len(a), len(b))


def encode_sentences(tokenizer: Tokenizer, examples: Sequence[TextExample], max_seq_len: int,
                     labels: np.ndarray, prompt_length: int = 0) -> Features:
    """Sentence (pair) features; `labels` [N] (ids or scores) becomes `label`. `prompt_length`
    slots after [CLS] are reserved for soft-prompt vectors (placeholder ids, input_mask 1)."""
    firsts = tokenizer.encode_batch([e.text for e in examples])
    paired = examples[0].text_pair is not None
    seconds = tokenizer.encode_batch([e.text_pair for e in examples]) if paired else None
    budget = max_seq_len - (3 if paired else 2) - prompt_length
    ids, segments, counts = [], [], collections.Counter()
    for i, first in enumerate(firsts):
        a, b, cut = truncate_pair(first, seconds[i] if paired else None, budget)
        counts["example(s) truncated to max_seq_len"] += cut
        row_ids, row_segments = assemble(tokenizer, a, b)
        slots = [tokenizer.special.pad] * prompt_length
        ids.append(row_ids[:1] + slots + row_ids[1:])
        segments.append([0] * prompt_length + row_segments)
    arrays = {"input_ids": _pad(ids, max_seq_len), "segment_ids": _pad(segments, max_seq_len),
              "input_mask": _pad([[1] * len(r) for r in ids], max_seq_len),
              "label": np.asarray(labels), "weight": np.ones(len(examples), np.float32)}
    return Features(arrays, counts)


def continuation_tag(tag: str) -> str:
    return "I-" + tag[2:] if tag.startswith("B-") else tag


def encode_tagged(tokenizer: Tokenizer, examples: Sequence[TaggedExample], max_seq_len: int,
                  tag_ids: dict[str, int], all_subwords: bool) -> Features:
    """Token classification features; unlabeled examples get label 0 (they are only predicted)."""
    words = [w for e in examples for w in e.words]
    pieces = iter(tokenizer.encode_batch(words))
    unk = tokenizer.special.unk
    rows_ids, rows_labels, rows_mask, starts = [], [], [], []
    counts = collections.Counter()
    for example in examples:
        ids, labels, mask, word_starts = [tokenizer.special.cls], [0], [0], []
        tags = example.tags or ["O"] * len(example.words)
        full = False
        for tag in tags:
            subwords = next(pieces).tolist() or [unk]  # a word that encodes to nothing keeps a slot
            full = full or len(ids) + len(subwords) > max_seq_len - 1
            if full:  # this word and all later ones are cut (a shorter one is not squeezed in)
                counts["word(s) cut by max_seq_len (predicted O)"] += 1
                continue
            word_starts.append(len(ids))
            rest = tag_ids.get(continuation_tag(tag), 0)
            ids += subwords
            labels += [tag_ids.get(tag, 0)] + [rest] * (len(subwords) - 1)
            mask += [1] + [int(all_subwords)] * (len(subwords) - 1)
        ids.append(tokenizer.special.sep)
        labels.append(0)
        mask.append(0)
        rows_ids.append(ids)
        rows_labels.append(labels)
        rows_mask.append(mask)
        starts.append(np.asarray(word_starts, np.int32))
    arrays = {"input_ids": _pad(rows_ids, max_seq_len),
              "segment_ids": np.zeros((len(examples), max_seq_len), np.int32),
              "input_mask": _pad([[1] * len(r) for r in rows_ids], max_seq_len),
              "label_ids": _pad(rows_labels, max_seq_len),
              "label_mask": _pad(rows_mask, max_seq_len),
              "weight": np.ones(len(examples), np.float32)}
    return Features(arrays, counts, word_starts=starts)


def context_words(context: str) -> list[tuple[str, tuple[int, int]]]:
    return BertPreTokenizer().pre_tokenize_str(context)


def answer_words(offsets: Sequence[tuple[int, int]], start: int, end: int) -> tuple[int, int]:
    """The first and last word overlapping characters [start, end), or (-1, -1)."""
    hit = [i for i, (a, b) in enumerate(offsets) if a < end and b > start]
    return (hit[0], hit[-1]) if hit else (-1, -1)


def doc_windows(total: int, size: int, stride: int) -> list[tuple[int, int]]:
    """(start, length) windows over `total` tokens, `stride` apart, the last one ending at total."""
    windows, start = [], 0
    while True:
        length = min(total - start, size)
        windows.append((start, length))
        if start + length >= total:
            return windows
        start += min(length, stride)


@dataclasses.dataclass(frozen=True)
class QASettings:
    """The QA task's lengths (its TaskSettings', from the data section)."""

    max_seq_len: int
    doc_stride: int
    max_query_length: int
    training: bool = False


def encode_qa(tokenizer: Tokenizer, examples: Sequence[QAExample], s: QASettings) -> Features:
    s_ids = tokenizer.special
    cached: dict[str, tuple] = {}
    questions = tokenizer.encode_batch([e.question for e in examples])
    rows = collections.defaultdict(list)
    counts = collections.Counter()
    offsets_per_example = []
    for index, example in enumerate(examples):
        if example.context not in cached:
            words = context_words(example.context)
            pieces = tokenizer.encode_batch([w for w, _ in words]) if words else []
            token_word = [i for i, p in enumerate(pieces) for _ in range(max(len(p), 1))]
            doc_ids = [t for p in pieces for t in (p.tolist() or [s_ids.unk])]
            cached[example.context] = ([o for _, o in words], token_word, doc_ids)
        offsets, token_word, doc_ids = cached[example.context]
        offsets_per_example.append(offsets)
        target = None
        if s.training:
            target = _answer_tokens(example, offsets, token_word)
            if target is None:
                counts["example(s) skipped: the answer is not at its offset in the context"] += 1
                continue
        question = questions[index][:s.max_query_length].tolist()
        size = s.max_seq_len - len(question) - 3
        windows = doc_windows(len(doc_ids), size, s.doc_stride)
        for start, length in windows:
            offset = len(question) + 2  # [CLS] question [SEP]
            positions = (0, 0)
            if target is not None:
                if not (start <= target[0] and target[1] < start + length):
                    counts["window(s) without the whole answer, not trained on"] += 1
                    continue
                positions = (target[0] - start + offset, target[1] - start + offset)
            ids = [s_ids.cls, *question, s_ids.sep, *doc_ids[start:start + length], s_ids.sep]
            rows["input_ids"].append(ids)
            rows["segment_ids"].append([0] * offset + [1] * (length + 1))
            rows["context_mask"].append([0] * offset + [1] * length)
            rows["positions"].append(positions)
            rows["example"].append(index)
            word_row = np.full(s.max_seq_len, -1, np.int64)
            word_row[offset:offset + length] = token_word[start:start + length]
            rows["token_word"].append(word_row)
            # Only span search (evaluation, prediction) reads it; all False for training rows.
            rows["max_context"].append(
                np.zeros(s.max_seq_len, bool) if s.training
                else _max_context_row(windows, start, length, offset, s.max_seq_len))
    return _qa_features(rows, counts, offsets_per_example, s.max_seq_len)


def _answer_tokens(example: QAExample, offsets, token_word) -> tuple[int, int] | None:
    """(first, last) token of the first answer, or None if it is not where it says it is."""
    if not example.answers:
        return None
    text, start = example.answers[0]
    if not text.strip() or example.context[start:start + len(text)] != text:
        return None
    first_word, last_word = answer_words(offsets, start, start + len(text))
    if first_word < 0:
        return None
    tokens = [t for t, w in enumerate(token_word) if first_word <= w <= last_word]
    return tokens[0], tokens[-1]


def _max_context_row(windows, start: int, length: int, offset: int, max_seq_len: int
                     ) -> np.ndarray:
    """True where this window gives the token its best context (BERT's _check_is_max_context:
    min(left, right) context + 0.01 * window length, the earliest window on ties)."""
    row = np.zeros(max_seq_len, bool)
    for position in range(start, start + length):
        best = max(range(len(windows)), key=lambda k: _context_score(windows[k], position))
        row[offset + position - start] = windows[best][0] == start
    return row


def _context_score(window: tuple[int, int], position: int) -> float:
    start, length = window
    if not start <= position < start + length:
        return -1.0
    return min(position - start, start + length - 1 - position) + 0.01 * length


def _qa_features(rows, counts, offsets_per_example, max_seq_len: int) -> Features:
    n = len(rows["input_ids"])
    positions = np.asarray(rows["positions"], np.int32).reshape(n, 2)
    arrays = {"input_ids": _pad(rows["input_ids"], max_seq_len),
              "segment_ids": _pad(rows["segment_ids"], max_seq_len),
              "input_mask": _pad([[1] * len(r) for r in rows["input_ids"]], max_seq_len),
              "context_mask": _pad(rows["context_mask"], max_seq_len),
              "start_positions": positions[:, 0], "end_positions": positions[:, 1],
              "weight": np.ones(n, np.float32)}
    windows = QAWindows(np.asarray(rows["example"], np.int64),
                        np.asarray(rows["token_word"], np.int64).reshape(n, max_seq_len),
                        np.asarray(rows["max_context"], bool).reshape(n, max_seq_len),
                        offsets_per_example)
    return Features(arrays, counts, windows=windows)


def batches(arrays: Arrays, batch_size: int) -> list[Arrays]:
    """The rows in order, in batches of exactly `batch_size` (the last completed with copies of
    the first row at weight 0)."""
    n = len(arrays["weight"])
    out = []
    for start in range(0, n, batch_size):
        index = np.arange(start, start + batch_size)
        out.append(take(arrays, index, valid=index < n))
    return out


def take(arrays: Arrays, index: np.ndarray, valid: np.ndarray | None = None) -> Arrays:
    """Rows `index`; where `valid` is False, row 0 with weight 0 (a placeholder)."""
    valid = np.ones(len(index), bool) if valid is None else valid
    safe = np.where(valid, index, 0)
    out = {key: value[safe] for key, value in arrays.items()}
    out["weight"] = np.where(valid, out["weight"], 0.0).astype(np.float32)
    return out
