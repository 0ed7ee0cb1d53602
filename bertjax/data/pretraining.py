"""Fixed-shape pretraining batches, step by step, with a checkpointable background iterator.

The batch of global step s holds the global examples [s*B, (s+1)*B) of the phase the length
schedule gives step s; process p of P builds only [s*B + p*B/P, s*B + (p+1)*B/P). Example g is
chunk perm_e(g mod n) of epoch e = g div n (n chunks at that seq_len; perm_e a keyed pseudo-random
permutation), laid out by examples.py and masked by masking.py with generators seeded by
(seed, split, g), so the global batch does not depend on the number of processes, each visit of a
chunk gets a new mask, and the iterator's whole state is the next step number.
"""

from __future__ import annotations

import numpy as np

from bertjax.data.batch_iterator import BatchIterator
from bertjax.data.corpus import PreparedCorpus
from bertjax.data.examples import MODES, PAIR_MODES, Example, ExampleSource
from bertjax.data import read_ahead, schema, streamed_corpus
from bertjax.data.length_schedule import LengthSchedule, Phase
from bertjax.data.masking import Masker
from bertjax.data.masking_config import MaskingConfig
from bertjax.core.errors import UserError, check_choice, check_int

TRAIN, EVAL = 0, 1          # split tags in generator seeds
EXAMPLE, MASK = 1, 2        # the two generator streams of an example
STATE_VERSION = 1


class BatchBuilder:
    """Builds any slice of any batch of one split; picklable, for worker processes."""

    def __init__(self, source: ExampleSource, masker: Masker, seed: int, split: int):
        self.source, self.masker, self.seed, self.split = source, masker, seed, split
        # Example g's generators are Philox streams keyed by (hash(seed, split, stream), g):
        # independent by construction, and re-keying a generator costs ~4 us where
        # np.random.default_rng([seed, split, g, stream]) costs ~70 us (SeedSequence hashing).
        self._stream_keys = {stream: int(np.random.SeedSequence([seed, split, stream])
                                         .generate_state(1, np.uint64)[0])
                             for stream in (EXAMPLE, MASK)}
        self._generators: list[np.random.Generator] = []

    def generators(self, stream: int, examples: list[int]) -> list[np.random.Generator]:
        """One generator per example, each at the start of its stream. They are reused: valid
        until the next call."""
        while len(self._generators) < len(examples):
            self._generators.append(np.random.Generator(np.random.Philox(0)))
        for generator, example in zip(self._generators, examples):
            generator.bit_generator.state = {
                "bit_generator": "Philox",
                "state": {"counter": np.zeros(4, np.uint64),
                          "key": np.array([self._stream_keys[stream], example], np.uint64)},
                "buffer": np.zeros(4, np.uint64), "buffer_pos": 4, "has_uint32": 0,
                "uinteger": 0}
        return self._generators[:len(examples)]

    def examples(self, seq_len: int, first: int, count: int) -> list[Example]:
        """Global examples [first, first + count), unpadded and unmasked."""
        indices = list(range(first, first + count))
        chunks = self.source.chunks(seq_len)[self.source.chunk_of(seq_len, np.array(indices))]
        return [self.source.build(chunk, seq_len, generator)
                for chunk, generator in zip(chunks, self.generators(EXAMPLE, indices))]

    def build(self, phase: Phase, first: int, count: int,
              fetched: dict | None = None) -> dict[str, np.ndarray]:
        """The slice; from a streamed corpus, out of the token ranges `fetched` for it (else
        each range is read as it is needed)."""
        if fetched is None:
            return self._build(phase, first, count)
        with streamed_corpus.serving(fetched):
            return self._build(phase, first, count)

    def _build(self, phase: Phase, first: int, count: int) -> dict[str, np.ndarray]:
        seq_len, source = phase.seq_len, self.source
        nsp, span = source.mode in PAIR_MODES, self.masker.config.strategy == "span"
        packed = source.mode == "documents"
        spec = schema.pretraining_batch_spec(count, seq_len, phase.max_predictions, nsp=nsp,
                                             span=span, packed=packed)
        shape, dtype = spec["input_ids"]
        ids = np.full(shape, source.special.pad, dtype)
        segment_ids = np.zeros(*spec["segment_ids"])
        lengths = np.zeros(count, np.int64)
        nsp_label = np.zeros(count, schema.NSP_FIELDS["nsp_label"].dtype)
        pack_ids = np.zeros(shape, np.int32)
        for row, example in enumerate(self.examples(seq_len, first, count)):
            lengths[row] = example.input_ids.size
            ids[row, :lengths[row]] = example.input_ids
            segment_ids[row, :lengths[row]] = example.segment_ids
            nsp_label[row] = example.nsp_label
            if packed:
                pack_ids[row, :lengths[row]] = example.pack_ids
        masked = self.masker.mask_batch(ids, phase.max_predictions,
                                        self.generators(MASK, list(range(first, first + count))))
        batch = {"input_ids": masked.pop("input_ids"), "segment_ids": segment_ids,
                 "input_mask": np.arange(seq_len) < lengths[:, None], **masked}
        if nsp:
            batch["nsp_label"] = nsp_label
        if packed:
            batch.update(pack_ids=pack_ids, positions=positions_in_documents(pack_ids))
        return schema.conform(batch, count, seq_len, phase.max_predictions, nsp=nsp, span=span,
                              packed=packed)


def positions_in_documents(pack_ids: np.ndarray) -> np.ndarray:
    """Each token's position counted from the first token of its document (pack id) in its row;
    padding (pack id 0) counts on from the last document, which no one attends to."""
    index = np.broadcast_to(np.arange(pack_ids.shape[1]), pack_ids.shape)
    starts = np.ones(pack_ids.shape, bool)
    starts[:, 1:] = (pack_ids[:, 1:] != pack_ids[:, :-1]) & (pack_ids[:, 1:] != 0)
    first = np.maximum.accumulate(np.where(starts, index, 0), axis=1)
    return (index - first).astype(np.int32)


class PretrainingData:
    """The pretraining input of one process: training batches by step, held-out eval batches."""

    def __init__(self, corpus: PreparedCorpus, *, mode: str, masking: MaskingConfig,
                 schedule: LengthSchedule, global_batch_size: int, seed: int,
                 process_index: int = 0, process_count: int = 1, short_seq_prob: float = 0.1,
                 eval_fraction: float = 0.01, workers: int = 2, prefetch: int = 4,
                 read_ahead_steps: int = 4, cache_mb: int = 256):
        check_choice("example mode", mode, MODES, unknown=True)
        if not isinstance(schedule, LengthSchedule):
            raise TypeError(f"schedule must be a LengthSchedule, got {type(schedule).__name__}")
        check_int("global_batch_size", global_batch_size, 1)
        check_int("process_count", process_count, 1)
        check_int("seed", seed, 0)
        check_int("workers", workers, 0)
        check_int("prefetch", prefetch, 1)
        check_int("read_ahead_steps", read_ahead_steps, 1)
        check_int("cache_mb", cache_mb, 1)
        if not isinstance(process_index, int) or not 0 <= process_index < process_count:
            raise UserError(f"process_index must be in [0, {process_count}), got {process_index!r}")
        if global_batch_size % process_count:
            raise UserError(f"the global batch size {global_batch_size} is not divisible by the "
                            f"number of processes {process_count}")
        tokenizer = corpus.tokenizer
        if tokenizer is None:
            raise UserError("the prepared corpus has no tokenizer")
        special = tokenizer.special
        masker = Masker(masking, vocab_size=tokenizer.vocab_size, mask_id=special.mask,
                        special_ids=special.as_array(), word_start=tokenizer.word_start_mask(),
                        unigram_counts=corpus.token_counts)
        train_docs, eval_docs = corpus.split_documents(eval_fraction)
        self.corpus, self.mode, self.schedule, self.seed = corpus, mode, schedule, seed
        self.global_batch_size, self.process_index = global_batch_size, process_index
        self.process_count = process_count
        self.local_batch_size = global_batch_size // process_count
        self.workers, self.prefetch = workers, prefetch
        self.read_ahead_steps, self.cache_bytes = read_ahead_steps, cache_mb << 20
        self.streamed = isinstance(corpus, streamed_corpus.StreamedCorpus)
        self._train = BatchBuilder(ExampleSource(
            corpus, train_docs, mode=mode, special=special, short_seq_prob=short_seq_prob,
            name="train", key=(seed, TRAIN)), masker, seed, TRAIN)
        self._eval = None
        if eval_docs.size:
            self._eval = BatchBuilder(ExampleSource(
                corpus, eval_docs, mode=mode, special=special, short_seq_prob=short_seq_prob,
                name="eval", key=(seed, EVAL)), masker, seed, EVAL)
        for phase in schedule.phases:  # refuse a corpus too small for a phase now, not mid-run
            self._train.source.chunks(phase.seq_len)

    @property
    def has_eval_data(self) -> bool:
        """Whether documents were held out (eval_fraction > 0), so eval_batches can work."""
        return self._eval is not None

    def num_chunks(self, seq_len: int, split: str = "train") -> int:
        """Examples in one epoch at `seq_len`."""
        return len(self.chunk_table(seq_len, split))

    def chunk_table(self, seq_len: int, split: str = "train") -> np.ndarray:
        """int64[num_chunks, 2]: the [start, end) global sentence range of each chunk."""
        return self._builder(split).source.chunks(seq_len)

    def chunk_indices(self, seq_len: int, examples: np.ndarray, split: str = "train") -> np.ndarray:
        """The chunk (row of `chunk_table`) each global example index draws its text from."""
        return self._builder(split).source.chunk_of(seq_len, examples)

    def examples(self, seq_len: int, first: int, count: int, split: str = "train") -> list[Example]:
        """The unmasked examples, with their provenance, that batches are built from: global
        example indices [first, first + count) at `seq_len` (for inspection and tests)."""
        return self._builder(split).examples(seq_len, first, count)

    def _builder(self, split: str) -> BatchBuilder:
        if split not in ("train", "eval"):
            raise ValueError(f"split must be 'train' or 'eval', got {split!r}")
        if split == "eval" and self._eval is None:
            raise UserError("no held-out documents to evaluate on: data.eval_fraction is 0")
        return self._train if split == "train" else self._eval

    def fingerprint(self) -> dict:
        """What must match for a saved iterator state to mean the same batches."""
        return {"version": STATE_VERSION, "mode": self.mode, "seed": self.seed,
                "global_batch_size": self.global_batch_size,
                "corpus_documents": self.corpus.num_documents,
                "corpus_tokens": self.corpus.num_tokens,
                "train_documents": int(self._train.source.documents.size)}

    def local_slice(self, step: int) -> tuple[Phase, int, int]:
        """(phase, first global example index, count) of this process's part of a step."""
        phase = self.schedule.phase_at(step)
        first = step * self.global_batch_size + self.process_index * self.local_batch_size
        return phase, first, self.local_batch_size

    def train_iterator(self, start_step: int = 0, end_step: int | None = None) -> "BatchIterator":
        """Batches from `start_step`; none is built (or read) ahead past `end_step`."""
        reads = None
        if self.streamed:
            reads = read_ahead.ReadAhead(self.local_slice, self._train, self.read_ahead_steps,
                                         self.cache_bytes, end_step)
        return BatchIterator(self, self._train, start_step, reads, end_step)

    def eval_batches(self, phase: Phase, num_batches: int) -> list[dict]:
        """This process's slices of the first `num_batches` held-out batches (identical on every
        call: fixed examples and masks)."""
        builder = self._builder("eval")
        check_int("num_batches", num_batches, 0)
        offset = self.process_index * self.local_batch_size
        slices = [(phase, i * self.global_batch_size + offset, self.local_batch_size)
                  for i in range(num_batches)]
        return [builder.build(*part, read_ahead.fetch_now(builder, *part) if self.streamed
                              else None) for part in slices]
