"""Pretraining examples from a prepared corpus: BERT sentence pairs and RoBERTa full sentences.

Every example is addressable: it is a pure function of (the corpus, a split, seq_len, a chunk
index, a generator), so any example can be rebuilt at any time and no iterator position needs
saving beyond a step number.

A "chunk" is the unit an epoch shuffles. Chunks are computed once per (split, seq_len), with
vectorized numpy (see `greedy_boundaries`), and follow the references exactly:
- "nsp" (google-research/bert `create_instances_from_document`): within a document, sentences
  are gathered until they reach max_num_tokens = seq_len - 3 tokens; A is the first k sentences
  of a chunk (k uniform in [1, n-1]), B the rest (IsNext) or a run of sentences from a random
  other document (NotNext), then `truncate_seq_pair`. With probability short_seq_prob the target
  is a random shorter length and the example uses only the chunk's prefix reaching it.
- "sop" (ALBERT's sentence-order prediction, Lan et al. 2020): the same chunks; A and B are
  two consecutive segments of one document (A the chunk's first k sentences, B the rest), swapped
  with probability 1/2 (label SWAPPED). A one-sentence document is cut inside its sentence.
- "full_sentences" (RoBERTa FULL-SENTENCES, fairseq `TokenBlockDataset` break_mode="complete"):
  whole sentences packed greedily up to seq_len - 2 tokens, crossing document boundaries with a
  [SEP] between documents. A sentence longer than the budget is an example of its own, truncated.
- "documents": the same rows as "full_sentences", each token labelled with the document it
  belongs to (its pack id; a document's [SEP] is its own, [CLS] the first document's) and its
  position inside that document, so that the model can keep packed documents from seeing one
  another (ModernBERT's packing without cross-contamination).
"""

from __future__ import annotations

import dataclasses
from typing import Callable, Sequence

import numpy as np

from bertjax.data.chunk_permutation import Permutation
from bertjax.data.corpus import PreparedCorpus
from bertjax.data.tokenizer import SpecialIds
from bertjax.core.errors import UserError, check_choice

MODES = ("nsp", "sop", "full_sentences", "documents")
PAIR_MODES = ("nsp", "sop")  # [CLS] A [SEP] B [SEP] with a label: the model's pair head reads it
MIN_SEQ_LEN = 5  # [CLS] A [SEP] B [SEP] with one token on each side
IS_NEXT, NOT_NEXT = 0, 1
IN_ORDER, SWAPPED = 0, 1  # "sop": Hugging Face's sentence_order_label


@dataclasses.dataclass(frozen=True)
class Example:
    """One example before padding and masking, with where its text came from."""
    input_ids: np.ndarray        # int32: [CLS] A [SEP] B [SEP] or [CLS] ... [SEP]
    segment_ids: np.ndarray      # int32, same length
    nsp_label: int               # IS_NEXT / NOT_NEXT (sop: IN_ORDER / SWAPPED); -1 if packed
    a_sentences: tuple[int, int]  # global sentence range of A (of all text, in full_sentences)
    b_sentences: tuple[int, int]  # global sentence range of B ((0, 0) in full_sentences)
    pack_ids: np.ndarray | None = None  # int32, "documents" mode: 1, 2, .. a document


def greedy_boundaries(step: Callable[[np.ndarray], np.ndarray], n: int,
                      block: int = 4096) -> np.ndarray:
    """The orbit 0 = x0 < x1 < ... < xm = n of x -> step(x), where step(x) > x elementwise.

    A Python loop over the orbit would cost seconds per million chunks. Instead the step is
    tabulated for every position (in slices, with sorted queries, which binary search fast), and
    one walker starts at every `block`-th position; all advance in lockstep, vectorized. The
    walker of block 0 is on the orbit; the orbit enters block k at the exit of block k-1, and from
    the first node it shares with walker k it follows walker k (the step is deterministic), so
    only the stretch before that meeting point, usually a chunk or two, is walked in Python.
    """
    if n <= 0:
        return np.zeros(1, np.int64)
    following = np.empty(n, np.int32 if n < 2**31 - 1 else np.int64)
    for lo in range(0, n, 1 << 20):
        following[lo:lo + (1 << 20)] = step(np.arange(lo, min(n, lo + (1 << 20)), dtype=np.int64))
    starts = np.arange(0, n, block, dtype=np.int64)
    limits = np.append(starts[1:], n)
    position = starts.copy()
    visited = []
    active = np.arange(starts.size)
    while active.size:
        visited.append(position[active])
        position[active] = following[position[active]]
        active = active[position[active] < limits[active]]
    nodes = np.sort(np.concatenate(visited))  # walker k's nodes all lie in [starts[k], limits[k])
    pieces, entry = [], 0
    for k in range(starts.size):
        if entry >= limits[k]:
            continue  # the orbit jumps over the whole block
        lo, hi = np.searchsorted(nodes, [starts[k], limits[k]])
        walker = nodes[lo:hi]
        detour, p = [], entry
        while p < limits[k] and walker[min(np.searchsorted(walker, p), walker.size - 1)] != p:
            detour.append(p)
            p = int(following[p])
        pieces.append(np.array(detour, np.int64))
        if p < limits[k]:
            pieces.append(walker[np.searchsorted(walker, p):])
            entry = int(position[k])
        else:
            entry = p
    pieces.append(np.array([n], np.int64))
    return np.concatenate(pieces)


def trimmed_lengths(len_a: int, len_b: int, max_tokens: int) -> tuple[int, int]:
    """Lengths `truncate_seq_pair` leaves: it trims the longer side (B on ties), a token a time."""
    excess = len_a + len_b - max_tokens
    if excess <= 0:
        return len_a, len_b
    gap = abs(len_a - len_b)
    if gap >= excess:
        return (len_a - excess, len_b) if len_a > len_b else (len_a, len_b - excess)
    rest, shorter = excess - gap, min(len_a, len_b)
    return shorter - rest // 2, shorter - (rest + 1) // 2


def truncate_pair(a: np.ndarray, b: np.ndarray, max_tokens: int,
                  rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """google-research/bert `truncate_seq_pair`: each trimmed token comes off the front or the
    back with probability 1/2, so the number taken off the front is Binomial(trimmed, 1/2)."""
    keep_a, keep_b = trimmed_lengths(len(a), len(b), max_tokens)
    front_a = int(rng.binomial(len(a) - keep_a, 0.5))
    front_b = int(rng.binomial(len(b) - keep_b, 0.5))
    return a[front_a:front_a + keep_a], b[front_b:front_b + keep_b]


class ExampleSource:
    """The examples of one split (a set of documents) of a corpus, in one mode."""

    def __init__(self, corpus: PreparedCorpus, documents: np.ndarray, *, mode: str,
                 special: SpecialIds, short_seq_prob: float = 0.1, name: str = "train",
                 key: Sequence[int] = (0,)):
        check_choice("example mode", mode, MODES, unknown=True)
        if not 0.0 <= short_seq_prob <= 1.0:
            raise UserError(f"short_seq_prob must be in [0, 1], got {short_seq_prob}")
        documents = np.unique(np.asarray(documents, np.int64))
        if documents.size == 0:
            raise UserError(f"the {name} split has no documents")
        self.corpus, self.documents, self.mode = corpus, documents, mode
        self.special, self.short_seq_prob, self.name = special, short_seq_prob, name
        self.key = [int(k) for k in key]  # seeds the epoch permutations
        self.in_split = np.zeros(corpus.num_documents, bool)
        self.in_split[documents] = True
        # NotNext segments come from another document of the split; a one-document split (a tiny
        # held-out set) borrows them from the whole corpus rather than having no negatives.
        self.negative_pool = documents if documents.size > 1 else np.arange(corpus.num_documents)
        if mode == "nsp" and self.negative_pool.size < 2:
            raise UserError("next-sentence prediction needs at least two documents; the corpus "
                            f"has {corpus.num_documents}")
        self._chunks: dict[int, np.ndarray] = {}

    def __getstate__(self) -> dict:
        # Worker processes recompute chunk tables instead of receiving them through a pipe, and
        # reopen an on-disk corpus (pickling its memory-mapped tokens would copy them all).
        state = {**self.__dict__, "_chunks": {}}
        if self.corpus.directory and self.corpus.reopen_in_workers:
            state["corpus"] = self.corpus.directory
        return state

    def __setstate__(self, state: dict) -> None:
        if isinstance(state["corpus"], str):
            state["corpus"] = PreparedCorpus.open(state["corpus"])
        self.__dict__.update(state)

    def chunks(self, seq_len: int) -> np.ndarray:
        """int64[num_chunks, 2]: [start, end) global sentence ranges, in corpus order."""
        if seq_len not in self._chunks:
            if seq_len < MIN_SEQ_LEN:
                raise UserError(f"seq_len {seq_len} is too short: at least {MIN_SEQ_LEN} needed")
            build = self._nsp_chunks if self.mode in PAIR_MODES else self._packed_chunks
            table = build(seq_len)
            if len(table) == 0:
                raise UserError(f"the {self.name} split yields no examples")
            self._chunks[seq_len] = table
        return self._chunks[seq_len]

    def chunk_of(self, seq_len: int, examples: np.ndarray) -> np.ndarray:
        """The chunk of each global example index g: perm_e(g mod n), epoch e = g div n."""
        n = len(self.chunks(seq_len))
        epochs, positions = np.divmod(np.asarray(examples, np.int64), n)
        chunks = np.empty_like(positions)
        for epoch in np.unique(epochs):
            at = epochs == epoch
            chunks[at] = Permutation(n, [*self.key, seq_len, int(epoch)])(positions[at])
        return chunks

    def _document_of(self, sentences: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.corpus.document_bounds, sentences, side="right") - 1

    def _nsp_chunks(self, seq_len: int) -> np.ndarray:
        offsets, doc_bounds = self.corpus.sentence_bounds, self.corpus.document_bounds
        budget = seq_len - 3

        def step(p: np.ndarray) -> np.ndarray:
            document_end = doc_bounds[np.searchsorted(doc_bounds, p, side="right")]
            return np.minimum(document_end, np.searchsorted(offsets, offsets[p] + budget))

        nodes = greedy_boundaries(step, self.corpus.num_sentences)
        table = np.stack([nodes[:-1], nodes[1:]], axis=1)
        return table[self.in_split[self._document_of(table[:, 0])]]

    def _packed_chunks(self, seq_len: int) -> np.ndarray:
        corpus = self.corpus
        sizes = np.diff(corpus.document_bounds)
        in_split = np.repeat(self.in_split, sizes)
        ends_document = np.zeros(corpus.num_sentences, bool)
        ends_document[corpus.document_bounds[1:] - 1] = True
        # Sentences of other splits cost nothing and are skipped when an example is built; a
        # document's last sentence pays for the [SEP] that follows it.
        cost = np.where(in_split, corpus.sentence_lengths + ends_document, 0).astype(np.int32)
        total = np.zeros(corpus.num_sentences + 1, np.int64)
        np.cumsum(cost, dtype=np.int64, out=total[1:])
        del cost, in_split, ends_document  # a full-size corpus has 10^8 sentences
        budget = seq_len - 2

        def step(p: np.ndarray) -> np.ndarray:
            first_paid = np.searchsorted(total, total[p], side="right")  # one past a paid sentence
            fits = np.searchsorted(total, total[p] + budget, side="right") - 1
            return np.minimum(np.maximum(first_paid, fits), corpus.num_sentences)

        nodes = greedy_boundaries(step, corpus.num_sentences)
        table = np.stack([nodes[:-1], nodes[1:]], axis=1)
        return table[total[table[:, 1]] > total[table[:, 0]]]

    def build(self, chunk: np.ndarray, seq_len: int, rng: np.random.Generator) -> Example:
        start, end = int(chunk[0]), int(chunk[1])
        if self.mode == "nsp":
            return self._pair(start, end, seq_len, rng)
        if self.mode == "sop":
            return self._ordered_pair(start, end, seq_len, rng)
        return self._packed(start, end, seq_len)

    def _take(self, start: int, stop: int, min_tokens: int) -> int:
        """End of the shortest run of sentences from `start` (at least one, at most up to `stop`)
        with `min_tokens` tokens."""
        offsets = self.corpus.sentence_bounds
        reach = int(np.searchsorted(offsets, offsets[start] + max(min_tokens, 1)))
        return min(max(reach, start + 1), stop)

    def _pair(self, start: int, end: int, seq_len: int, rng: np.random.Generator) -> Example:
        budget = seq_len - 3
        target = budget
        if rng.random() < self.short_seq_prob:
            target = int(rng.integers(2, budget + 1))
        end = self._take(start, end, target)
        document = int(self._document_of(np.array([start]))[0])
        doc_start, doc_end = self.corpus.document_sentences(document)
        used = end - start
        a_end = start + (int(rng.integers(1, used)) if used >= 2 else 1)
        # BERT makes a one-sentence chunk always NotNext; that would tilt the labels away from
        # 50/50, so a lone sentence is paired with its neighbour in the document instead.
        is_random = rng.random() < 0.5 or doc_end - doc_start < 2
        a_start = start
        if is_random:
            # Uniform over the pool without the example's own document (the pool holds it).
            other = int(rng.integers(self.negative_pool.size - 1))
            other += other >= int(np.searchsorted(self.negative_pool, document))
            b_doc_start, b_doc_end = self.corpus.document_sentences(int(self.negative_pool[other]))
            b_start = int(rng.integers(b_doc_start, b_doc_end))
            a_len = int(self.corpus.sentence_bounds[a_end] - self.corpus.sentence_bounds[start])
            b_end = self._take(b_start, b_doc_end, target - a_len)
        elif used >= 2:
            b_start, b_end = a_end, end
        elif end < doc_end:
            a_len = int(self.corpus.sentence_lengths[start])
            b_start, b_end = end, self._take(end, doc_end, target - a_len)
        else:  # the document's last sentence: B is it, A the sentence before
            a_start, a_end, b_start, b_end = start - 1, start, start, end
        a, b = truncate_pair(self.corpus.tokens(a_start, a_end), self.corpus.tokens(b_start, b_end),
                             budget, rng)
        s = self.special
        ids = np.concatenate([[s.cls], a, [s.sep], b, [s.sep]]).astype(np.int32)
        segments = np.zeros(ids.size, np.int32)
        segments[a.size + 2:] = 1
        return Example(ids, segments, NOT_NEXT if is_random else IS_NEXT,
                       (a_start, a_end), (b_start, b_end))

    def _ordered_pair(self, start: int, end: int, seq_len: int,
                      rng: np.random.Generator) -> Example:
        budget = seq_len - 3
        target = budget
        if rng.random() < self.short_seq_prob:
            target = int(rng.integers(2, budget + 1))
        end = self._take(start, end, target)
        doc_start, doc_end = self.corpus.document_sentences(
            int(self._document_of(np.array([start]))[0]))
        if end - start >= 2:
            a_end = start + int(rng.integers(1, end - start))
            ranges = (start, a_end), (a_end, end)
        elif end < doc_end:  # a lone sentence: B is what follows it
            a_len = int(self.corpus.sentence_lengths[start])
            ranges = (start, end), (end, self._take(end, doc_end, target - a_len))
        elif start > doc_start:  # the document's last sentence: A is the one before
            ranges = (start - 1, start), (start, end)
        else:  # a one-sentence document: its sentence, cut in two
            ranges = (start, end), (start, end)
        a, b = (self.corpus.tokens(*r) for r in ranges)
        if ranges[0] == ranges[1]:
            cut = int(rng.integers(1, a.size)) if a.size >= 2 else a.size
            a, b = a[:cut], a[cut:]
        a, b = truncate_pair(a, b, budget, rng)
        swapped = rng.random() < 0.5
        if swapped:
            a, b, ranges = b, a, ranges[::-1]
        s = self.special
        ids = np.concatenate([[s.cls], a, [s.sep], b, [s.sep]]).astype(np.int32)
        segments = np.zeros(ids.size, np.int32)
        segments[a.size + 2:] = 1
        return Example(ids, segments, SWAPPED if swapped else IN_ORDER, *ranges)

    def _packed(self, start: int, end: int, seq_len: int) -> Example:
        corpus, sep = self.corpus, self.special.sep
        first_doc, last_doc = self._document_of(np.array([start, end - 1]))
        pieces, owners = [], []
        for document in range(int(first_doc), int(last_doc) + 1):
            if not self.in_split[document]:
                continue
            doc_start, doc_end = corpus.document_sentences(document)
            if pieces:  # the [SEP] that ends the previous document is that document's
                pieces.append(np.array([sep], np.int32))
                owners.append(np.full(1, len(owners) // 2 + 1, np.int32))
            pieces.append(corpus.tokens(max(start, doc_start), min(end, doc_end)))
            owners.append(np.full(pieces[-1].size, len(owners) // 2 + 1, np.int32))
        body = np.concatenate(pieces)[:seq_len - 2]
        ids = np.concatenate([[self.special.cls], body, [sep]]).astype(np.int32)
        pack_ids = None
        if self.mode == "documents":
            owner = np.concatenate(owners)[:seq_len - 2]
            pack_ids = np.concatenate([owner[:1], owner, owner[-1:]]).astype(np.int32)
        return Example(ids, np.zeros(ids.size, np.int32), -1, (start, end), (0, 0), pack_ids)
