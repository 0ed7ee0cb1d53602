"""The background batch iterator over a step-indexed batch source (`PretrainingData`): batches
built ahead in spawned worker processes, in order; checkpointable, its whole state being the next
step."""

from __future__ import annotations

import collections
import concurrent.futures
import multiprocessing
import signal
import time
import weakref
from typing import Protocol

import numpy as np

from bertjax.data.length_schedule import Phase
from bertjax.core.errors import UserError, check_int


class SliceBuilder(Protocol):
    """Builds any slice of any batch; picklable, as it is sent to the worker processes."""

    def build(self, phase: Phase, first: int, count: int,
              fetched: dict | None = None) -> dict[str, np.ndarray]: ...


class StepSlices(Protocol):
    """What the iterator needs of the data: this process's slice of each step, and what a saved
    state must match."""

    workers: int
    prefetch: int

    def local_slice(self, step: int) -> tuple[Phase, int, int]: ...

    def fingerprint(self) -> dict: ...


class StepReads(Protocol):
    """Inputs fetched ahead for each step (read_ahead.ReadAhead), handed to the builder with the
    step's slice."""

    bytes_fetched: int

    def fetched(self, step: int) -> dict: ...

    def close(self) -> None: ...


# Worker processes receive the builder once, at start-up, and then only (phase, first, count)
# and, from a streamed corpus, the token ranges fetched for that slice.
_worker_builder: SliceBuilder | None = None


def _start_worker(builder: SliceBuilder) -> None:
    global _worker_builder
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is the parent's to handle
    _worker_builder = builder


def _build_in_worker(*job) -> dict[str, np.ndarray]:
    return _worker_builder.build(*job)  # (phase, first, count[, fetched ranges])


class BatchIterator:
    """This process's batches, one per step from `start_step`; the state is the next step.

    With workers > 0, batches are built ahead in worker processes (a ProcessPoolExecutor), in
    order, `prefetch` steps ahead. Why not grain's mp_prefetch: a batch is a pure function of its
    step, so grain's iterator state and re-slicing buy nothing here, while in grain 0.2.18 it
    reads an absl flag in the parent (it fails outside an absl app, e.g. in tests) and ships
    elements through shared memory; an executor gives dynamic load balancing, ordered futures
    and a blocking shutdown. Workers are spawned, not forked: forking a process that runs JAX's
    threads can deadlock. workers=0 builds each batch in the caller.

    `reads` (a streamed corpus) fetch each step's inputs ahead; no batch is built ahead past
    `end_step` (exclusive), when given. `counters()` says how long `next` waited since it was
    last asked, and what `reads` fetched meanwhile.
    """

    def __init__(self, data: StepSlices, builder: SliceBuilder, start_step: int = 0,
                 reads: StepReads | None = None, end_step: int | None = None):
        check_int("start_step", start_step, 0)
        self._data, self._builder, self._reads, self._end_step = data, builder, reads, end_step
        self._waited_s, self._counted_bytes = 0.0, 0
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
            if self._end_step is not None and step >= self._end_step:
                return
            self._pending.append(self._pool.submit(_build_in_worker, *self._job(step)))

    def _job(self, step: int) -> tuple:
        """The builder's arguments for this process's slice of `step`."""
        job = self._data.local_slice(step)
        return job if self._reads is None else (*job, self._reads.fetched(step))

    def _drop_pending(self) -> None:
        for future in self._pending:
            future.cancel()
        self._pending.clear()

    def __iter__(self) -> "BatchIterator":
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        if self._closed:
            raise ValueError("the batch iterator is closed")
        started = time.perf_counter()
        if self._pool is None or not self._pending:
            batch = self._builder.build(*self._job(self._next_step))
        else:
            try:
                batch = self._pending.popleft().result()
            except BaseException:
                self._drop_pending()  # a retry starts again at this step
                raise
        self._next_step += 1
        if self._pool is not None:
            self._refill()
        self._waited_s += time.perf_counter() - started
        return batch

    def counters(self) -> dict:
        """{"data_wait_s": seconds `next` took since the last call, and with `reads`
        "data_bytes_fetched": the bytes they fetched meanwhile}."""
        counted = {"data_wait_s": round(self._waited_s, 4)}
        self._waited_s = 0.0
        if self._reads is not None:
            total = self._reads.bytes_fetched
            counted["data_bytes_fetched"] = total - self._counted_bytes
            self._counted_bytes = total
        return counted

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
        if self._reads is not None:
            self._reads.close()
        if self._pool is not None:
            self._finalizer()
            self._pool = None

    def __enter__(self) -> "BatchIterator":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _shutdown(pool: concurrent.futures.ProcessPoolExecutor) -> None:
    pool.shutdown(wait=True, cancel_futures=True)
