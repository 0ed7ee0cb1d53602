"""Tokenizing groups of documents into shards, here or in a pool of worker processes, with only a
few groups in flight at once; shards already complete are counted, not redone."""

from __future__ import annotations

import collections
import itertools
import multiprocessing
import os
import sys
from typing import Iterator, Sequence

import numpy as np
from tqdm import tqdm

from bertjax.data import corpus
from bertjax.data.tokenizer import Tokenizer
from bertjax.core.errors import UserError

# tokenizers keeps per-token offsets and strings for a whole batch: encode in bounded batches.
_ENCODE_BATCH = 4096
_IN_FLIGHT_PER_WORKER = 2


def write_shards(documents: Iterator[list[str]], output_dir: str, tokenizer: Tokenizer,
                  documents_per_shard: int, workers: int,
                  progress: bool) -> tuple[list[corpus.ShardStats], int]:
    """Writes every shard not complete yet; returns all shards' stats and the new tokens."""
    shards: dict[int, corpus.ShardStats] = {}

    def jobs() -> Iterator[tuple[int, list[list[str]]]]:
        for index, group in enumerate(_batched(documents, documents_per_shard)):
            if corpus.shard_is_complete(output_dir, index):
                shards[index] = read_shard_stats(output_dir, index)
            else:
                yield index, group

    new_tokens = 0
    with tqdm(unit="tok", unit_scale=True, desc="tokenizing", disable=not progress,
              file=sys.stderr, dynamic_ncols=True) as bar:
        for index, shard in _run(jobs(), tokenizer, output_dir, workers):
            shards[index] = shard
            new_tokens += shard.tokens
            bar.update(shard.tokens)
            bar.set_postfix(shards=len(shards), refresh=False)
    return [shards[i] for i in range(len(shards))], new_tokens


def _run(jobs: Iterator[tuple[int, list[list[str]]]], tokenizer: Tokenizer, output_dir: str,
         workers: int) -> Iterator[tuple[int, corpus.ShardStats]]:
    """tokenize_and_write for each job, here (1 worker) or in `workers` spawned processes (a
    fork after the tokenizer's thread pool has run can deadlock), a few jobs in flight."""
    if workers == 1:
        for index, group in jobs:
            yield index, tokenize_and_write(tokenizer, output_dir, index, group)
        return
    pending: collections.deque = collections.deque()
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers, _init_worker, (tokenizer, output_dir)) as pool:
        for job in jobs:
            pending.append(pool.apply_async(_worker_task, job))
            while pending and (len(pending) >= _IN_FLIGHT_PER_WORKER * workers
                               or pending[0].ready()):
                yield pending.popleft().get()
        while pending:
            yield pending.popleft().get()


def _batched(items: Iterator[list[str]], size: int) -> Iterator[list[list[str]]]:
    while True:
        group = list(itertools.islice(items, size))
        if not group:
            return
        yield group


def read_shard_stats(output_dir: str, index: int) -> corpus.ShardStats:
    """Counts of a complete shard, from its boundary arrays (corpus.py's documented layout)."""
    path = corpus.shard_path(output_dir, index)
    try:
        sentences = np.load(os.path.join(path, "sentence_bounds.npy"), mmap_mode="r")
        documents = np.load(os.path.join(path, "document_bounds.npy"), mmap_mode="r")
    except (OSError, ValueError) as e:
        raise UserError(f"corrupt shard {path}: {e}; delete it and run again") from None
    return corpus.ShardStats(len(documents) - 1, len(sentences) - 1, int(sentences[-1]))


def tokenize_and_write(tokenizer: Tokenizer, output_dir: str, index: int,
                       group: Sequence[Sequence[str]]) -> corpus.ShardStats:
    """Tokenizes one group of documents and writes it as shard `index`."""
    flat = [sentence for document in group for sentence in document]
    ids: list[np.ndarray] = []
    for start in range(0, len(flat), _ENCODE_BATCH):
        ids.extend(tokenizer.encode_batch(flat[start:start + _ENCODE_BATCH]))
    documents, start = [], 0
    for document in group:
        documents.append(ids[start:start + len(document)])
        start += len(document)
    return corpus.write_shard(output_dir, index, documents, tokenizer.vocab_size)


_worker_state: tuple[Tokenizer, str] | None = None


def _init_worker(tokenizer: Tokenizer, output_dir: str) -> None:
    global _worker_state
    # One process per core already: the tokenizer's own thread pool would only oversubscribe.
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    _worker_state = (tokenizer, output_dir)


def _worker_task(index: int, group: list[list[str]]) -> tuple[int, corpus.ShardStats]:
    tokenizer, output_dir = _worker_state
    return index, tokenize_and_write(tokenizer, output_dir, index, group)
