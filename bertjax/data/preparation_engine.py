"""Raw text -> tokenized shards on disk (corpus.py's format), done once: parallel, bounded in
memory, atomic and resumable.

The main process streams documents from the sources and hands groups of `documents_per_shard`
documents (shard i holds documents [i*K, (i+1)*K) in source order) to worker processes, which
tokenize and write their shard (shard_writing.py). `plan.json`, written first, fingerprints the
inputs, the tokenizer and the shard size (preparation_plan.py): a rerun with the same fingerprint
skips the complete shards and finishes the rest; a different one is refused and nothing is
touched. The manifest is written last: its presence means "complete".
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
import time
from typing import Callable, Protocol, Sequence

from bertjax.core import storage
from bertjax.data import corpus
from bertjax.data.full_disk import full_disk_reported
from bertjax.core.atomic_files import write_json
from bertjax.data.inputs import resolve_inputs
from bertjax.data.preparation_plan import PLAN, exclusive_output, make_plan
from bertjax.data.shard_writing import write_shards
from bertjax.data.sources import (DEFAULT_MAX_LINE_CHARS, FORMATS, SourceStats, is_tfds,
                                  iter_documents)
from bertjax.data.tokenizer import Tokenizer
from bertjax.core.errors import UserError
from bertjax.core.file_modes import publish

DEFAULT_DOCUMENTS_PER_SHARD = 10_000


class DistributedWriter(Protocol):
    """Reads the inputs and writes every shard not complete yet, as `write_shards` would (shard i
    holds documents [i*K, (i+1)*K) in source order), filling in `stats`; returns every shard's
    stats and the new tokens. `runner` names it in the manifest."""

    runner: str

    def __call__(self, files: list[str], input_format: str, output_dir: str,
                 tokenizer: Tokenizer, documents_per_shard: int, max_line_chars: int,
                 tfds_data_dir: str | None,
                 stats: SourceStats) -> tuple[list[corpus.ShardStats], int]: ...


def prepare(inputs: Sequence[str], input_format: str, output_dir: str, tokenizer: Tokenizer, *,
            documents_per_shard: int = DEFAULT_DOCUMENTS_PER_SHARD, workers: int | None = None,
            progress: bool = True, max_line_chars: int = DEFAULT_MAX_LINE_CHARS,
            tfds_data_dir: str | None = None, on_start: Callable[[], None] | None = None,
            distributed: DistributedWriter | None = None) -> dict:
    """Prepares (or finishes preparing) the corpus in `output_dir`; returns its manifest.

    `workers` processes tokenize (default: one per core; 1 tokenizes in this process). A
    progress bar with tokens/s goes to stderr. `tfds:` inputs are read from `tfds_data_dir`
    (default: TFDS's own, $TFDS_DATA_DIR or ~/tensorflow_datasets). `on_start` is called once
    the checks made before any work have passed: what a caller says about the run goes there,
    so that a refusal is never preceded by it. `distributed`, when given, reads the inputs and
    writes the shards in this process's place (beam_preparation.py); planning, locking, the
    tokenizer and the manifest stay here, so both ways give the same corpus.
    """
    if documents_per_shard < 1:
        raise UserError(f"documents_per_shard must be positive, got {documents_per_shard}")
    workers = (os.cpu_count() or 1) if workers is None else workers
    if workers < 1:
        raise UserError(f"workers must be positive, got {workers}")
    if input_format not in FORMATS:
        raise UserError(f"unknown input format {input_format!r}; expected one of "
                        f"{', '.join(FORMATS)}")
    # The output may sit inside an input directory: never read our own shards back as text.
    files = [f for f in _input_files(inputs, distributed) if is_tfds(f) or storage.is_url(f)
             or not _is_within(f, output_dir)]
    plan = make_plan(files, input_format, tokenizer, documents_per_shard, max_line_chars, tfds_data_dir)
    created = not os.path.exists(output_dir)
    with full_disk_reported(output_dir), exclusive_output(output_dir, plan) as done:
        if on_start is not None:
            on_start()
        if done is not None:
            return done
        write_json(os.path.join(output_dir, PLAN), plan)
        save_tokenizer(tokenizer, output_dir)
        corpus.remove_partial_shards(output_dir)
        stats = SourceStats()
        start = time.perf_counter()
        try:
            if distributed is None:
                documents = iter_documents(files, input_format, stats=stats,
                                           max_line_chars=max_line_chars,
                                           tfds_data_dir=tfds_data_dir)
                shards, new_tokens = write_shards(documents, output_dir, tokenizer,
                                                  documents_per_shard, workers, progress)
            else:
                shards, new_tokens = distributed(files, input_format, output_dir, tokenizer,
                                                 documents_per_shard, max_line_chars,
                                                 tfds_data_dir, stats)
        except UserError:
            _abandon_if_nothing_written(output_dir, created)
            raise
        seconds = time.perf_counter() - start
        described = {} if distributed is None else {"runner": distributed.runner}
        corpus.write_manifest(output_dir, shards, tokenizer.vocab_size, extra={**described,
            "inputs": list(inputs), "input_format": input_format,
            "fingerprint": plan["fingerprint"], "plan": plan, "source": stats.to_json(),
            "documents_per_shard": documents_per_shard, "seconds": round(seconds, 3),
            "tokens_per_sec": round(new_tokens / seconds, 1) if seconds > 0 else 0.0})
        return corpus.read_manifest(output_dir)


def _input_files(inputs: Sequence[str], distributed: DistributedWriter | None) -> list[str]:
    """The files the inputs name; object URLs (a distributed preparation's workers read them
    themselves) pass as they are."""
    if not any(storage.is_url(spec) for spec in inputs):
        return resolve_inputs(inputs)
    if distributed is None:
        raise UserError("inputs named by URL are read through local copies "
                        "(transfer.local_inputs) unless a pipeline's workers read them")
    files: list[str] = []
    for spec in inputs:
        files += [spec] if storage.is_url(spec) else resolve_inputs([spec])
    return list(dict.fromkeys(files))


def _is_within(path: str, directory: str) -> bool:
    path, directory = os.path.realpath(path), os.path.realpath(directory)
    return os.path.commonpath([path, directory]) == directory


def _abandon_if_nothing_written(output_dir: str, created: bool) -> None:
    """After bad input that stopped a run before its first shard: leave no plan behind, which
    would tie the directory to inputs the user is about to fix."""
    shards_dir = os.path.join(output_dir, corpus.SHARDS_DIR)
    if os.path.isdir(shards_dir) and any(not n.startswith(".") for n in os.listdir(shards_dir)):
        return  # complete shards: keep them for the resumed run
    shutil.rmtree(shards_dir, ignore_errors=True)
    shutil.rmtree(os.path.join(output_dir, corpus.TOKENIZER_DIR), ignore_errors=True)
    os.remove(os.path.join(output_dir, PLAN))
    if created:
        os.remove(os.path.join(output_dir, ".lock"))
        with contextlib.suppress(OSError):
            os.rmdir(output_dir)


def save_tokenizer(tokenizer: Tokenizer, output_dir: str) -> None:
    """output_dir/tokenizer, published whole (a temporary directory renamed), kept if there."""
    final = os.path.join(output_dir, corpus.TOKENIZER_DIR)
    if os.path.isdir(final):
        return  # same plan (or languages record), so the same tokenizer
    tmp = tempfile.mkdtemp(prefix=f".{corpus.TOKENIZER_DIR}.tmp-", dir=output_dir)
    try:
        tokenizer.save(tmp)
        publish(tmp)
        os.rename(tmp, final)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
