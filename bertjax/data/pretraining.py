"""Fixed-shape pretraining batches, step by step, with a checkpointable background iterator.

The batch of global step s holds the global examples [s*B, (s+1)*B) of the phase the length
schedule gives step s; process p of P builds only [s*B + p*B/P, s*B + (p+1)*B/P). Example g is
chunk perm_e(g mod n) of epoch e = g div n (n chunks at that seq_len; perm_e a keyed pseudo-random
permutation), laid out by examples.py and masked by masking.py with generators seeded by
(seed, split, g), so the global batch does not depend on the number of processes, each visit of a
chunk gets a new mask, and the iterator's whole state is the next step number.
"""

from __future__ import annotations

import bisect
import collections
import concurrent.futures
import dataclasses
import multiprocessing
import signal
import weakref

import numpy as np

from bertjax.data.corpus import PreparedCorpus
from bertjax.data.examples import MIN_SEQ_LEN, MODES, Example, ExampleSource
from bertjax.data.masking import Masker, MaskingConfig
from bertjax.errors import UserError

TRAIN, EVAL = 0, 1          # split tags in generator seeds
EXAMPLE, MASK = 1, 2        # the two generator streams of an example
STATE_VERSION = 1


@dataclasses.dataclass(frozen=True)
class Phase:
    seq_len: int
    max_predictions: int
    start_step: int

    def __post_init__(self):
        _check_int("seq_len", self.seq_len, MIN_SEQ_LEN, "([CLS] A [SEP] B [SEP])")
        _check_int("max_predictions", self.max_predictions, 1)
        if self.max_predictions > self.seq_len:
            raise UserError(f"max_predictions {self.max_predictions} exceeds seq_len "
                            f"{self.seq_len}")
        _check_int("a phase's start_step", self.start_step, 0)
        for name in ("seq_len", "max_predictions", "start_step"):
            object.__setattr__(self, name, int(getattr(self, name)))


@dataclasses.dataclass(frozen=True)
class LengthSchedule:
    phases: tuple[Phase, ...]  # sorted by start_step, the first starting at 0

    def __post_init__(self):
        phases = tuple(self.phases)
        object.__setattr__(self, "phases", phases)
        if not phases or phases[0].start_step != 0:
            raise UserError("a length schedule needs a first phase starting at step 0")
        starts = [p.start_step for p in phases]
        if any(b <= a for a, b in zip(starts, starts[1:])):
            raise UserError(f"phase start steps must increase strictly, got {starts}")

    def phase_at(self, step: int) -> Phase:
        if step < 0:
            raise UserError(f"step must not be negative, got {step}")
        return self.phases[bisect.bisect_right([p.start_step for p in self.phases], step) - 1]

    @classmethod
    def bert(cls, total_steps: int, long_fraction: float = 0.1, short: tuple[int, int] = (128, 20),
             long: tuple[int, int] = (512, 80)) -> "LengthSchedule":
        """Short sequences, then long ones for the last `long_fraction` of the steps."""
        _check_int("total_steps", total_steps, 1)
        if not 0.0 <= long_fraction <= 1.0:
            raise UserError(f"long_fraction must be in [0, 1], got {long_fraction}")
        long_start = round(total_steps * (1.0 - long_fraction))
        if long_fraction == 0 or long_start >= total_steps:
            return cls((Phase(*short, 0),))
        if long_start <= 0:
            return cls((Phase(*long, 0),))
        return cls((Phase(*short, 0), Phase(*long, long_start)))


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

    def build(self, phase: Phase, first: int, count: int) -> dict[str, np.ndarray]:
        seq_len, source = phase.seq_len, self.source
        ids = np.full((count, seq_len), source.special.pad, np.int32)
        segment_ids = np.zeros((count, seq_len), np.int32)
        lengths = np.zeros(count, np.int64)
        nsp_label = np.zeros(count, np.int32)
        for row, example in enumerate(self.examples(seq_len, first, count)):
            lengths[row] = example.input_ids.size
            ids[row, :lengths[row]] = example.input_ids
            segment_ids[row, :lengths[row]] = example.segment_ids
            nsp_label[row] = example.nsp_label
        masked = self.masker.mask_batch(ids, phase.max_predictions,
                                        self.generators(MASK, list(range(first, first + count))))
        batch = {"input_ids": masked.pop("input_ids"), "segment_ids": segment_ids,
                 "input_mask": (np.arange(seq_len) < lengths[:, None]).astype(np.int32),
                 **masked}
        if source.mode == "nsp":
            batch["nsp_label"] = nsp_label
        return batch


class PretrainingData:
    """The pretraining input of one process: training batches by step, held-out eval batches."""

    def __init__(self, corpus: PreparedCorpus, *, mode: str, masking: MaskingConfig,
                 schedule: LengthSchedule, global_batch_size: int, seed: int,
                 process_index: int = 0, process_count: int = 1, short_seq_prob: float = 0.1,
                 eval_fraction: float = 0.01, workers: int = 2, prefetch: int = 4):
        if mode not in MODES:
            raise UserError(f"unknown example mode {mode!r}; choose one of {', '.join(MODES)}")
        if not isinstance(schedule, LengthSchedule):
            raise UserError(f"schedule must be a LengthSchedule, got {type(schedule).__name__}")
        _check_int("global_batch_size", global_batch_size, 1)
        _check_int("process_count", process_count, 1)
        _check_int("seed", seed, 0)
        _check_int("workers", workers, 0)
        _check_int("prefetch", prefetch, 1)
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
            raise UserError(f"split must be 'train' or 'eval', got {split!r}")
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

    def train_iterator(self, start_step: int = 0) -> "BatchIterator":
        return BatchIterator(self, self._train, start_step)

    def eval_batches(self, phase: Phase, num_batches: int) -> list[dict]:
        """This process's slices of the first `num_batches` held-out batches (identical on every
        call: fixed examples and masks)."""
        builder = self._builder("eval")
        _check_int("num_batches", num_batches, 0)
        offset = self.process_index * self.local_batch_size
        return [builder.build(phase, i * self.global_batch_size + offset, self.local_batch_size)
                for i in range(num_batches)]


def _check_int(name: str, value, minimum: int, why: str = "") -> None:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < minimum:
        raise UserError(f"{name} must be an integer of at least {minimum}{' ' + why if why else ''}"
                        f", got {value!r}")


# Worker processes receive the builder once, at start-up, and then only (phase, first, count).
_worker_builder: BatchBuilder | None = None


def _start_worker(builder: BatchBuilder) -> None:
    global _worker_builder
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _worker_builder = builder


def _build_in_worker(phase: Phase, first: int, count: int) -> dict[str, np.ndarray]:
    return _worker_builder.build(phase, first, count)


class BatchIterator:
    """This process's batches, one per step from `start_step`; the state is the next step.

    With workers > 0, batches are built ahead in worker processes (a ProcessPoolExecutor), in
    order, `prefetch` steps ahead. Why not grain's mp_prefetch: a batch is a pure function of its
    step, so grain's iterator state and re-slicing buy nothing here, while in grain 0.2.18 it
    reads an absl flag in the parent (it fails outside an absl app, e.g. in tests) and ships
    elements through shared memory; an executor gives dynamic load balancing, ordered futures
    and a blocking shutdown. Workers are spawned, not forked: forking a process that runs JAX's
    threads can deadlock. workers=0 builds each batch in the caller.
    """

    def __init__(self, data: PretrainingData, builder: BatchBuilder, start_step: int = 0):
        _check_int("start_step", start_step, 0)
        self._data, self._builder = data, builder
        self._next_step = int(start_step)
        self._pending: collections.deque = collections.deque()  # futures of the next steps
        self._pool = None
        self._closed = False
        if data.workers > 0:
            self._pool = concurrent.futures.ProcessPoolExecutor(
                data.workers, mp_context=multiprocessing.get_context("spawn"),
                initializer=_start_worker, initargs=(builder,))
            self._finalizer = weakref.finalize(self, _shutdown, self._pool)
            self._refill()  # workers start on the first batches while the caller compiles

    def _refill(self) -> None:
        while len(self._pending) < self._data.prefetch:
            step = self._next_step + len(self._pending)
            self._pending.append(self._pool.submit(_build_in_worker, *self._data.local_slice(step)))

    def _drop_pending(self) -> None:
        for future in self._pending:
            future.cancel()
        self._pending.clear()

    def __iter__(self) -> "BatchIterator":
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self._closed:
            raise ValueError("the batch iterator is closed")
        if self._pool is None:
            batch = self._builder.build(*self._data.local_slice(self._next_step))
        else:
            try:
                batch = self._pending.popleft().result()
            except BaseException:
                self._drop_pending()  # a retry starts again at this step
                raise
        self._next_step += 1
        if self._pool is not None:
            self._refill()
        return batch

    @property
    def step(self) -> int:
        """The step whose batch `next` returns."""
        return self._next_step

    def get_state(self) -> dict:
        return {"step": self._next_step, **self._data.fingerprint()}

    def set_state(self, state: dict) -> None:
        expected = self._data.fingerprint()
        if not isinstance(state, dict) or not isinstance(state.get("step"), int) \
                or state["step"] < 0:
            raise UserError(f"not a batch iterator state: {state!r}")
        changed = [f"{k} {state.get(k)!r} -> {v!r}" for k, v in expected.items()
                   if state.get(k) != v]
        if changed:
            raise UserError("the saved data iterator state belongs to other data settings ("
                            + ", ".join(changed) + "); resume with the run's own config")
        if state["step"] != self._next_step:  # else the batches in flight are the right ones
            self._drop_pending()
            self._next_step = state["step"]
        if self._pool is not None and not self._closed:
            self._refill()

    def close(self) -> None:
        """Stops and joins the workers; idempotent."""
        self._closed = True
        self._drop_pending()
        if self._pool is not None:
            self._finalizer()
            self._pool = None

    def __enter__(self) -> "BatchIterator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _shutdown(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    pool.shutdown(wait=True, cancel_futures=True)
