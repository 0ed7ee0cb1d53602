"""The reads of the next steps' batches from a streamed corpus, fetched before they are needed.

A batch is a function of (seed, step), so the token ranges of the next `steps_ahead` steps are
known: each is planned (streamed_corpus.recording) and fetched (streamed_corpus.read_ranges) by
a small thread pool, in step order, into memory that holds at most `cache_bytes` of fetched
ranges not yet taken (a step whose own reads exceed it is still let in, alone). The batch
iterator takes a step's ranges when it hands the step to a builder (streamed_corpus.serving);
in steady state they arrived steps earlier and the training step does not wait on the network.
"""

from __future__ import annotations

import concurrent.futures
import copy
import queue
import threading
from typing import Callable

import numpy as np

from bertjax.data import streamed_corpus
from bertjax.data.length_schedule import Phase

READ_THREADS = 4
# What one example reads at most, in sequences of tokens: BERT's pair reads A and B before
# truncating them to one sequence; a 4-byte token is the widest corpus.py writes.
SEQUENCES_READ_PER_EXAMPLE = 2
WIDEST_TOKEN_BYTES = 4


def step_bytes_bound(rows: int, seq_len: int) -> int:
    """The bytes one step's reads take at most (but for single sentences longer than seq_len)."""
    return rows * seq_len * SEQUENCES_READ_PER_EXAMPLE * WIDEST_TOKEN_BYTES


def planned_ranges(builder, phase: Phase, first: int, count: int) -> list[streamed_corpus.Range]:
    """The token ranges that building examples [first, first + count) reads; `builder` must
    not be building anything else meanwhile (its generators are reused)."""
    with streamed_corpus.recording() as ranges:
        builder.examples(phase.seq_len, first, count)
    return ranges


def fetch_now(builder, phase: Phase, first: int, count: int) -> dict:
    """The ranges of one slice, planned and fetched here (eval batches, once each)."""
    shards = builder.source.corpus.shards
    tokens, _ = streamed_corpus.read_ranges(
        shards, planned_ranges(_copy_of(builder), phase, first, count))
    return tokens


def _copy_of(builder):
    """A builder of the same examples with generators of its own, for planning alongside it."""
    planner = copy.copy(builder)
    planner._generators = []
    return planner


class _FetchThreads:
    """A few daemon threads running submitted calls in order. Not a ThreadPoolExecutor: its
    threads are joined when the interpreter exits, so a run ending on a storage fault would first
    wait out the reads still in flight (each bounded, but with the backend's retries)."""

    def __init__(self, count: int):
        self._count = count
        self._calls: queue.SimpleQueue = queue.SimpleQueue()
        for n in range(count):
            threading.Thread(target=self._work, name=f"bertjax-read-ahead-{n}", daemon=True).start()

    def submit(self, fn, *args) -> concurrent.futures.Future:
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._calls.put((future, fn, args))
        return future

    def _work(self) -> None:
        while (call := self._calls.get()) is not None:
            future, fn, args = call
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(fn(*args))
            except BaseException as e:  # the taker of the step raises it
                future.set_exception(e)

    def shutdown(self) -> None:
        for _ in range(self._count):
            self._calls.put(None)


class _Window:
    """The steps submitted from one starting step on, and the memory their ranges hold."""

    def __init__(self, start: int):
        self.futures: dict[int, concurrent.futures.Future] = {}
        self.next_submit = start
        self.next_admit = start  # ranges are let into memory in step order
        self.held = 0
        self.closed = False
        self.changed = threading.Condition()


class ReadAhead:
    """Fetched ranges of the steps after the one taken, `steps_ahead` of them (up to
    `end_step`, exclusive, when given)."""

    def __init__(self, slice_of: Callable[[int], tuple[Phase, int, int]], builder,
                 steps_ahead: int, cache_bytes: int, end_step: int | None = None):
        self._slice_of, self._builder = slice_of, builder
        self._shards = builder.source.corpus.shards
        self._steps_ahead, self._cache_bytes, self._end_step = steps_ahead, cache_bytes, end_step
        self._pool = _FetchThreads(READ_THREADS)
        self._planners = threading.local()
        self._window: _Window | None = None
        self._lock = threading.Lock()
        self.bytes_fetched = 0

    def fetched(self, step: int) -> dict:
        """Step `step`'s ranges (waiting for them when they are not there yet); a storage fault
        while fetching them is raised here."""
        window = self._window
        if window is None or step not in window.futures:
            window = self._restart(step)
        future = window.futures.pop(step)
        self._submit_through(window, step + 1 + self._steps_ahead)
        tokens, nbytes = future.result()
        with window.changed:
            window.held -= nbytes
            window.changed.notify_all()
        return tokens

    def _restart(self, step: int) -> _Window:
        """A new window from `step` (the first call, or a jump: a restored iterator state)."""
        self._close_window()
        self._window = _Window(step)
        self._submit_through(self._window, step + 1, past_end=True)
        return self._window

    def _submit_through(self, window: _Window, end: int, past_end: bool = False) -> None:
        if self._end_step is not None and not past_end:
            end = min(end, self._end_step)
        while window.next_submit < end:
            step = window.next_submit
            window.futures[step] = self._pool.submit(self._read, window, step)
            window.next_submit += 1

    def _read(self, window: _Window, step: int) -> tuple[dict, int]:
        admitted = False
        try:
            ranges = planned_ranges(self._planner(), *self._slice_of(step))
            requests = streamed_corpus.coalesced(self._shards, ranges)
            nbytes = sum(last - first for _, first, last in requests)
            with window.changed:
                window.changed.wait_for(lambda: window.closed or (
                    window.next_admit == step
                    and (window.held == 0 or window.held + nbytes <= self._cache_bytes)))
                if window.closed:
                    return {}, 0
                window.held += nbytes
                window.next_admit += 1
                admitted = True
                window.changed.notify_all()
            tokens, fetched = streamed_corpus.read_ranges(self._shards, ranges)
            with self._lock:
                self.bytes_fetched += fetched
            return tokens, nbytes
        finally:
            if not admitted:  # a failed plan must not hold up the steps after it
                with window.changed:
                    window.next_admit = max(window.next_admit, step + 1)
                    window.changed.notify_all()

    def _planner(self):
        planner = getattr(self._planners, "builder", None)
        if planner is None:
            planner = self._planners.builder = _copy_of(self._builder)
        return planner

    def _close_window(self) -> None:
        window, self._window = self._window, None
        if window is None:
            return
        for future in window.futures.values():
            future.cancel()
        with window.changed:
            window.closed = True
            window.changed.notify_all()

    def close(self) -> None:
        """Stops reading ahead; reads in flight end on their own (each is bounded)."""
        self._close_window()
        self._pool.shutdown()


def rows_bytes(fetched: dict) -> int:
    """The bytes of the token ranges a slice reads (what the rows need, without merging)."""
    return int(sum(np.asarray(tokens).nbytes for tokens in fetched.values()))
