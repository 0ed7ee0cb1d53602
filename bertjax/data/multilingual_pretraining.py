"""Multilingual pretraining batches: each example's language drawn with smoothed probabilities,
and held-out batches per language.

Global example g is in language l = sampler(seed, g) (language_sampling.py, p_l from the
languages' training tokens) and is chunk perm_{l,e}(g mod n_l) of language l's n_l chunks, epoch
e = g div n_l (the same keyed permutations as the monolingual batches, one per language). So a
batch is still a pure function of (seed, step) and the iterator's state is still its step. A
language's chunks are visited in its own permutation's order at the rate it is drawn.
"""

from __future__ import annotations

import numpy as np

from bertjax.data.chunk_permutation import Permutation
from bertjax.data.examples import Example, ExampleSource
from bertjax.data.language_sampling import LanguageSampler, smoothed_probabilities
from bertjax.data.length_schedule import Phase
from bertjax.data.multilingual_corpus import MultilingualCorpus
from bertjax.data.parallel_text import ParallelPairs
from bertjax.data.pretraining import EVAL, TRAIN, BatchBuilder, PretrainingData
from bertjax.data.tlm_batches import LanguageTaggedSource, TlmBuilder
from bertjax.core.errors import UserError


class MultilingualSource:
    """The training examples of several languages, as one ExampleSource to a BatchBuilder: the
    chunk table is the languages' tables one after another; `chunk_of` draws the language."""

    def __init__(self, sources: list[ExampleSource], sampler: LanguageSampler, key: list[int]):
        self.sources, self.sampler, self.key = sources, sampler, key
        self.mode, self.special = sources[0].mode, sources[0].special
        self.documents = np.concatenate([s.documents for s in sources])
        self._offsets: dict[int, np.ndarray] = {}
        self._tables: dict[int, np.ndarray] = {}

    def chunks(self, seq_len: int) -> np.ndarray:
        if seq_len not in self._tables:
            tables = [s.chunks(seq_len) for s in self.sources]
            self._offsets[seq_len] = np.cumsum([0] + [len(t) for t in tables])
            self._tables[seq_len] = np.concatenate(tables)
        return self._tables[seq_len]

    def chunk_of(self, seq_len: int, examples: np.ndarray) -> np.ndarray:
        self.chunks(seq_len)
        examples = np.asarray(examples, np.int64)
        languages = self.sampler.languages_of(examples)
        chunks = np.empty_like(examples)
        for language in np.unique(languages):
            at = languages == language
            n = len(self.sources[language].chunks(seq_len))
            epochs, positions = np.divmod(examples[at], n)
            picked = np.empty_like(positions)
            for epoch in np.unique(epochs):
                same = epochs == epoch
                picked[same] = Permutation(n, [*self.key, int(language), seq_len, int(epoch)])(
                    positions[same])
            chunks[at] = picked + self._offsets[seq_len][language]
        return chunks

    def build(self, chunk: np.ndarray, seq_len: int, rng: np.random.Generator) -> Example:
        # Every chunk lies inside one language (the tables never cross them): NSP negatives and
        # packed neighbours come from the same language.
        corpus = self.sources[0].corpus
        document = int(np.searchsorted(corpus.document_bounds, chunk[0], side="right") - 1)
        return self.sources[int(corpus.document_languages[document])].build(chunk, seq_len, rng)


class MultilingualPretrainingData(PretrainingData):
    """PretrainingData over a MultilingualCorpus: training batches mix the languages with
    p_l proportional to (the language's share of training tokens)^alpha; held-out batches come
    per language too (`eval_batches_by_language`)."""

    def __init__(self, corpus: MultilingualCorpus, *, alpha: float,
                 parallel: ParallelPairs | None = None, tlm_fraction: float = 0.0, **kwargs):
        super().__init__(corpus, **kwargs)
        self.alpha, self.parallel, self.tlm_fraction = alpha, parallel, tlm_fraction
        # With parallel text (XLM), every token carries its language id in its segment id.
        source_class = ExampleSource if parallel is None else LanguageTaggedSource
        train_docs = self._train.source.documents
        _, eval_docs = corpus.split_documents(kwargs.get("eval_fraction", 0.01))
        masker, special = self._train.masker, corpus.tokenizer.special
        options = dict(mode=self.mode, special=special,
                       short_seq_prob=self._train.source.short_seq_prob)
        sources, tokens = [], []
        for language, code in enumerate(corpus.languages):
            documents = corpus.language_documents(train_docs, language)
            if documents.size == 0:
                raise UserError(f"language {code} has no training documents")
            sources.append(source_class(corpus, documents, name=f"{code} train",
                                        key=(self.seed, TRAIN, language), **options))
            sources[-1].language_id = language
            tokens.append(_tokens_of(corpus, documents))
        self.probabilities = smoothed_probabilities(np.array(tokens), alpha)
        sampler = LanguageSampler(self.probabilities, [self.seed, TRAIN])
        mixed = MultilingualSource(sources, sampler, [self.seed, TRAIN])
        self._train = BatchBuilder(mixed, masker, self.seed, TRAIN)
        if parallel is not None:
            self._train = self._tlm_builder(mixed, masker, kwargs.get("eval_fraction", 0.01))
        self._eval_languages: dict[str, BatchBuilder] = {}
        for language, code in enumerate(corpus.languages):
            documents = corpus.language_documents(eval_docs, language)
            if documents.size:
                source = source_class(corpus, documents, name=f"{code} eval",
                                      key=(self.seed, EVAL, language), **options)
                source.language_id = language
                self._eval_languages[code] = BatchBuilder(source, masker, self.seed, EVAL)
        if parallel is not None and len(self._eval_languages) == len(sources):
            # The pooled held-out batches, language-tagged too: each language in its proportion.
            self._eval = BatchBuilder(MultilingualSource(
                [b.source for b in self._eval_languages.values()],
                LanguageSampler(self.probabilities, [self.seed, EVAL]), [self.seed, EVAL]),
                masker, self.seed, EVAL)
        for phase in self.schedule.phases:
            self._train.source.chunks(phase.seq_len)

    def _tlm_builder(self, mixed: MultilingualSource, masker, eval_fraction: float) -> TlmBuilder:
        parallel, languages = self.parallel, self.corpus.languages
        for code in (parallel.a, parallel.b):
            if code not in languages:
                raise UserError(f"the parallel text is in {code}, which is not one of the "
                                f"languages ({', '.join(languages)})")
        train_pairs, _ = parallel.split(eval_fraction)
        return TlmBuilder(mixed, masker, self.seed, TRAIN, pairs=parallel,
                          pair_indices=train_pairs, tlm_fraction=self.tlm_fraction,
                          language_ids=(languages.index(parallel.a), languages.index(parallel.b)))

    @property
    def languages(self) -> list[str]:
        return list(self.corpus.languages)

    def fingerprint(self) -> dict:
        tlm = {} if self.parallel is None else {"tlm_fraction": self.tlm_fraction,
                                                "parallel_pairs": len(self.parallel)}
        return {**super().fingerprint(), "languages": self.languages,
                "language_alpha": self.alpha, **tlm}

    def eval_batches_by_language(self, phase: Phase, num_batches: int) -> dict[str, list[dict]]:
        """This process's slices of each language's first `num_batches` held-out batches."""
        offset = self.process_index * self.local_batch_size
        return {code: [builder.build(phase, i * self.global_batch_size + offset,
                                     self.local_batch_size) for i in range(num_batches)]
                for code, builder in self._eval_languages.items()}


def _tokens_of(corpus: MultilingualCorpus, documents: np.ndarray) -> int:
    first = corpus.sentence_bounds[corpus.document_bounds[documents]]
    last = corpus.sentence_bounds[corpus.document_bounds[documents + 1]]
    return int((last - first).sum())
