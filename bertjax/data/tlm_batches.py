"""XLM's translation language modelling (Lample & Conneau, 2019) mixed with multilingual MLM.

A TLM row is a translation pair concatenated, `[CLS] A [SEP] B [SEP]`, masked as any row is (so
both sides lose tokens, and a masked word can be read off its translation), with positions that
restart at 0 at B's first token and language ids per side in the segment ids (the segment table
is XLM's language embedding: model.type_vocab_size >= the number of languages). Monolingual rows
carry their language's id on every token. Which side comes first is drawn per row.

Global example g is a TLM row when a keyed hash of (seed, g) falls below `tlm_fraction`; its
pair is perm_e(g mod n) of the n training pairs, epoch e = g div n. So a batch stays a pure
function of (seed, step). Rows use the packed schema (positions, pack ids): every token of a TLM
row has pack id 1, so the two sides attend to each other.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from bertjax.data.chunk_permutation import Permutation
from bertjax.data.examples import Example, ExampleSource, truncate_pair
from bertjax.data.language_sampling import LanguageSampler
from bertjax.data.length_schedule import Phase
from bertjax.data.parallel_text import ParallelPairs
from bertjax.data.pretraining import EXAMPLE, BatchBuilder

_TLM_STREAM = [4]  # keys the row-kind draws apart from the language draws


class LanguageTaggedSource(ExampleSource):
    """An ExampleSource whose examples carry `language_id` as every token's segment id."""

    language_id: int = 0

    def build(self, chunk: np.ndarray, seq_len: int, rng: np.random.Generator) -> Example:
        example = super().build(chunk, seq_len, rng)
        return dataclasses.replace(
            example, segment_ids=np.full(example.input_ids.size, self.language_id, np.int32))


class TlmBuilder(BatchBuilder):
    """Builds rows of which a `tlm_fraction` share are translation pairs, the rest from
    `source` (a MultilingualSource of language-tagged sources)."""

    def __init__(self, source, masker, seed: int, split: int, *, pairs: ParallelPairs,
                 pair_indices: np.ndarray, language_ids: tuple[int, int], tlm_fraction: float):
        super().__init__(source, masker, seed, split)
        self.pairs, self.pair_indices = pairs, np.asarray(pair_indices, np.int64)
        self.language_ids, self.tlm_fraction = language_ids, tlm_fraction
        self._kind = LanguageSampler(np.array([tlm_fraction, 1 - tlm_fraction]),
                                     [seed, split, *_TLM_STREAM])
        self._second_starts: dict[int, int] = {}  # row -> B's first position, of the last build

    def is_tlm(self, examples: np.ndarray) -> np.ndarray:
        if self.tlm_fraction == 0:
            return np.zeros(len(examples), bool)
        return self._kind.languages_of(np.asarray(examples, np.int64)) == 0

    def examples(self, seq_len: int, first: int, count: int) -> list[Example]:
        indices = np.arange(first, first + count)
        tlm = self.is_tlm(indices)
        rows: list[Example | None] = [None] * count
        self._second_starts = {}
        mono = np.flatnonzero(~tlm)
        if mono.size:
            chunks = self.source.chunks(seq_len)[self.source.chunk_of(seq_len, indices[mono])]
            generators = self.generators(EXAMPLE, indices[mono].tolist())
            for row, chunk, generator in zip(mono, chunks, generators):
                rows[row] = self.source.build(chunk, seq_len, generator)
        tlm_rows = np.flatnonzero(tlm)
        if tlm_rows.size:
            n = len(self.pair_indices)
            generators = self.generators(EXAMPLE, indices[tlm_rows].tolist())
            for row, generator in zip(tlm_rows, generators):
                epoch, position = divmod(int(indices[row]), n)
                pair = self.pair_indices[Permutation(n, [self.seed, self.split, *_TLM_STREAM,
                                                         seq_len, epoch])(np.array([position]))[0]]
                rows[row] = self._pair_row(int(pair), seq_len, generator)
                self._second_starts[int(row)] = int(rows[row].b_sentences[0])
        return rows

    def _pair_row(self, pair: int, seq_len: int, rng: np.random.Generator) -> Example:
        a, b = self.pairs.pair(pair)
        ids_a, ids_b = self.language_ids
        if rng.random() < 0.5:  # both directions, as XLM trains them
            a, b, ids_a, ids_b = b, a, ids_b, ids_a
        a, b = truncate_pair(a, b, seq_len - 3, rng)
        s = self.source.special
        ids = np.concatenate([[s.cls], a, [s.sep], b, [s.sep]]).astype(np.int32)
        second = a.size + 2
        segments = np.full(ids.size, ids_a, np.int32)
        segments[second:] = ids_b
        return Example(ids, segments, -1, (pair, pair + 1), (second, ids.size),
                       np.ones(ids.size, np.int32))

    def build(self, phase: Phase, first: int, count: int) -> dict[str, np.ndarray]:
        batch = super().build(phase, first, count)
        for row, second in self._second_starts.items():
            length = int(batch["input_mask"][row].sum())
            batch["positions"][row, second:length] = np.arange(length - second)
        return batch
