"""Raw text -> tokenized shards on disk (corpus.py's format), done once: parallel, bounded in
memory, atomic and resumable.

The main process streams documents from the sources and hands groups of `documents_per_shard`
documents (shard i holds documents [i*K, (i+1)*K) in source order) to worker processes, which
tokenize and write their shard; only a few groups are in flight at once. `plan.json`, written
first, fingerprints the inputs (paths, sizes, times), the tokenizer and the shard size: a rerun
with the same fingerprint skips the complete shards and finishes the rest; a different one is
refused and nothing is touched. The manifest is written last: its presence means "complete".

    python -m bertjax.data.prepare --input 'corpus/*.txt.gz' --format sentences --output DIR \
        [--vocab vocab.txt | --train-vocab wordpiece --vocab-size 30522] [--workers 8]
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import fcntl
import hashlib
import itertools
import json
import multiprocessing
import os
import shutil
import sys
import tempfile
import time
from typing import Iterator, Sequence

import numpy as np
from tqdm import tqdm

from bertjax.data import corpus
from bertjax.data.sources import (DEFAULT_MAX_LINE_CHARS, FORMATS, SourceStats, is_tfds,
                                  iter_documents, resolve_inputs)
from bertjax.data.tokenizer import (Tokenizer, load_tokenizer, train_sentencepiece,
                                    train_wordpiece)
from bertjax.errors import EXIT_BAD_INPUT, UserError, exit_on_user_error, report

PLAN = "plan.json"
DEFAULT_DOCUMENTS_PER_SHARD = 10_000
TOKENIZER_KINDS = ("wordpiece", "sentencepiece")
# tokenizers keeps per-token offsets and strings for a whole batch: encode in bounded batches.
_ENCODE_BATCH = 4096
_IN_FLIGHT_PER_WORKER = 2


def prepare(inputs: Sequence[str], input_format: str, output_dir: str, tokenizer: Tokenizer, *,
            documents_per_shard: int = DEFAULT_DOCUMENTS_PER_SHARD, workers: int | None = None,
            progress: bool = True, max_line_chars: int = DEFAULT_MAX_LINE_CHARS,
            tfds_data_dir: str | None = None) -> dict:
    """Prepares (or finishes preparing) the corpus in `output_dir`; returns its manifest.

    `workers` processes tokenize (default: one per core; 1 tokenizes in this process). A
    progress bar with tokens/s goes to stderr. `tfds:` inputs are read from `tfds_data_dir`
    (default: TFDS's own, $TFDS_DATA_DIR or ~/tensorflow_datasets).
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
    files = [f for f in resolve_inputs(inputs) if is_tfds(f) or not _is_within(f, output_dir)]
    plan = _plan(files, input_format, tokenizer, documents_per_shard, max_line_chars, tfds_data_dir)
    created = not os.path.exists(output_dir)
    with _exclusive(output_dir, plan) as done:
        if done is not None:
            return done
        _write_json(os.path.join(output_dir, PLAN), plan)
        _save_tokenizer(tokenizer, output_dir)
        corpus.remove_partial_shards(output_dir)
        stats = SourceStats()
        start = time.perf_counter()
        try:
            documents = iter_documents(files, input_format, stats=stats,
                                       max_line_chars=max_line_chars, tfds_data_dir=tfds_data_dir)
            shards, new_tokens = _write_shards(documents, output_dir, tokenizer,
                                               documents_per_shard, workers, progress)
        except UserError:
            _abandon_if_nothing_written(output_dir, created)
            raise
        seconds = time.perf_counter() - start
        corpus.write_manifest(output_dir, shards, tokenizer.vocab_size, extra={
            "inputs": list(inputs), "input_format": input_format,
            "fingerprint": plan["fingerprint"], "plan": plan, "source": stats.to_json(),
            "documents_per_shard": documents_per_shard, "seconds": round(seconds, 3),
            "tokens_per_sec": round(new_tokens / seconds, 1) if seconds > 0 else 0.0})
        return corpus.read_manifest(output_dir)


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


def tokenizer_hash(tokenizer: Tokenizer) -> str:
    """sha256 of the tokenizer's saved files: equal hashes mean equal ids for every text."""
    digest = hashlib.sha256()
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save(tmp)
        for name in sorted(os.listdir(tmp)):
            digest.update(name.encode() + b"\0")
            with open(os.path.join(tmp, name), "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()


def _plan(files: list[str], input_format: str, tokenizer: Tokenizer, documents_per_shard: int,
          max_line_chars: int, tfds_data_dir: str | None) -> dict:
    described = []
    for path in files:
        if is_tfds(path):
            data_dir = tfds_data_dir or os.environ.get("TFDS_DATA_DIR", "")
            described.append({"tfds": path, "data_dir": data_dir and os.path.abspath(data_dir)})
        else:
            st = os.stat(path)
            described.append({"path": os.path.abspath(path), "size": st.st_size,
                              "mtime_ns": st.st_mtime_ns})
    plan = {"inputs": described, "input_format": input_format,
            "tokenizer": {"kind": tokenizer.kind, "vocab_size": tokenizer.vocab_size,
                          "lowercase": tokenizer.lowercase, "sha256": tokenizer_hash(tokenizer)},
            "documents_per_shard": documents_per_shard, "max_line_chars": max_line_chars}
    plan["fingerprint"] = hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()
    return plan


@contextlib.contextmanager
def _exclusive(output_dir: str, plan: dict) -> Iterator[dict | None]:
    """Holds the output directory's lock; yields the manifest when this preparation is done.

    Directories that must be refused are refused before anything is created in them.
    """
    done = _existing_result(output_dir, plan)
    if done is not None:
        yield done
        return
    try:
        os.makedirs(output_dir, exist_ok=True)
        lock = open(os.path.join(output_dir, ".lock"), "a")
    except OSError as e:
        raise UserError(f"cannot write to {output_dir}: {e}") from None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"another preparation is writing to {output_dir}") from None
        yield _existing_result(output_dir, plan)  # again: another run may have finished it


def _existing_result(output_dir: str, plan: dict) -> dict | None:
    """The manifest when this exact preparation is done; None to (re)start; else UserError."""
    entries = sorted(n for n in os.listdir(output_dir) if n != ".lock") if os.path.isdir(
        output_dir) else []
    if not entries:
        return None
    refusal = (f"{output_dir} holds {{}} of other {{}}; nothing was changed (choose another "
               "output directory)")
    if corpus.MANIFEST in entries:
        manifest = corpus.read_manifest(output_dir)
        if manifest.get("fingerprint") == plan["fingerprint"]:
            return manifest
        raise UserError(refusal.format("a prepared corpus",
                                       _difference(manifest.get("plan"), plan)))
    if PLAN not in entries:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise UserError(f"{output_dir} is not empty and holds no preparation ({shown}); "
                        "refusing to write into it")
    plan_path = os.path.join(output_dir, PLAN)
    try:
        with open(plan_path) as f:
            stored = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {plan_path}: {e}") from None
    if stored.get("fingerprint") != plan["fingerprint"]:
        raise UserError(refusal.format("an unfinished preparation", _difference(stored, plan)))
    return None


def _difference(stored: dict | None, plan: dict) -> str:
    keys = [k for k in plan if k != "fingerprint" and (stored or {}).get(k) != plan[k]]
    names = {"inputs": "inputs (paths, sizes or times)", "input_format": "input format",
             "tokenizer": "tokenizer", "documents_per_shard": "shard size",
             "max_line_chars": "max_line_chars"}
    return ", ".join(names[k] for k in keys) or "settings"


def _write_json(path: str, content: dict) -> None:
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(content, f, indent=2)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _save_tokenizer(tokenizer: Tokenizer, output_dir: str) -> None:
    final = os.path.join(output_dir, corpus.TOKENIZER_DIR)
    if os.path.isdir(final):
        return  # same fingerprint, so the same tokenizer
    tmp = tempfile.mkdtemp(prefix=f".{corpus.TOKENIZER_DIR}.tmp-", dir=output_dir)
    tokenizer.save(tmp)
    os.rename(tmp, final)


def _write_shards(documents: Iterator[list[str]], output_dir: str, tokenizer: Tokenizer,
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


def build_tokenizer(inputs: Sequence[str], input_format: str, kind: str = "wordpiece",
                    vocab_size: int = 30522, lowercase: bool = True,
                    max_sentences: int = 10_000_000,
                    max_line_chars: int = DEFAULT_MAX_LINE_CHARS) -> Tokenizer:
    """Trains a tokenizer on the first `max_sentences` sentences of the sources, streamed."""
    if kind not in TOKENIZER_KINDS:
        raise UserError(f"unknown tokenizer kind {kind!r}; expected one of "
                        f"{', '.join(TOKENIZER_KINDS)}")
    if max_sentences < 1:
        raise UserError(f"max_sentences must be positive, got {max_sentences}")
    documents = iter_documents(inputs, input_format, max_line_chars=max_line_chars)
    sentences = (sentence for document in documents for sentence in document)
    # Pull the first sentence here so an empty corpus raises UserError in Python, not mid-training.
    first = next(sentences)
    sample = itertools.islice(itertools.chain([first], sentences), max_sentences)
    if kind == "wordpiece":
        return train_wordpiece(sample, vocab_size=vocab_size, lowercase=lowercase)
    return train_sentencepiece(sample, vocab_size=vocab_size, lowercase=lowercase,
                               max_sentences=max_sentences)


def summary(manifest: dict, output_dir: str) -> str:
    source = manifest.get("source", {})
    skipped = source.get("skipped_lines", {})
    skipped_text = ", ".join(f"{k}={v}" for k, v in skipped.items()) or "none"
    return (f"prepared {output_dir}: {manifest['documents']} documents, {manifest['sentences']} "
            f"sentences, {manifest['tokens']} tokens in {len(manifest['shards'])} shards, "
            f"{manifest.get('tokens_per_sec', 0):.0f} tokens/s; skipped lines: {skipped_text}")


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bertjax.data.prepare",
                                     description="Tokenizes a text corpus into shards, once.")
    parser.add_argument("--input", required=True,
                        help="files, directories or globs, comma-separated")
    parser.add_argument("--format", default="sentences", choices=FORMATS)
    parser.add_argument("--output", required=True, help="directory for the prepared corpus")
    vocab = parser.add_mutually_exclusive_group()
    vocab.add_argument("--vocab", help="vocab.txt, SentencePiece .model, or a tokenizer directory")
    vocab.add_argument("--train-vocab", choices=TOKENIZER_KINDS, default="wordpiece",
                       help="train this kind of tokenizer on the corpus (when --vocab is absent)")
    parser.add_argument("--vocab-size", type=int, default=30522)
    parser.add_argument("--max-train-sentences", type=int, default=10_000_000)
    parser.add_argument("--cased", action="store_true", help="keep case and accents")
    parser.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    parser.add_argument("--documents-per-shard", type=int, default=DEFAULT_DOCUMENTS_PER_SHARD)
    parser.add_argument("--max-line-chars", type=int, default=DEFAULT_MAX_LINE_CHARS)
    parser.add_argument("--no-progress", action="store_true")
    parser.error = _one_line_error
    return parser.parse_args(argv)


def _one_line_error(message: str) -> None:
    """argparse's errors, in the same one-line form as every other bad input."""
    report(message)
    sys.exit(EXIT_BAD_INPUT)


def _cli_tokenizer(args: argparse.Namespace, inputs: list[str]) -> Tokenizer:
    if args.vocab:
        return load_tokenizer(args.vocab, lowercase=False if args.cased else None)
    saved = os.path.join(args.output, corpus.TOKENIZER_DIR)
    if os.path.isdir(saved):
        # Resuming or re-running: training again could give another vocabulary.
        tokenizer = load_tokenizer(saved)
        if tokenizer.kind != args.train_vocab or tokenizer.lowercase == args.cased:
            raise UserError(f"{args.output} holds a {tokenizer.kind} tokenizer "
                            f"({'uncased' if tokenizer.lowercase else 'cased'}) trained earlier; "
                            "choose another output directory for another kind")
        print(f"using the tokenizer trained earlier in {saved}", file=sys.stderr)
        return tokenizer
    return build_tokenizer(inputs, args.format, args.train_vocab, args.vocab_size,
                           lowercase=not args.cased, max_sentences=args.max_train_sentences,
                           max_line_chars=args.max_line_chars)


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    inputs = [spec.strip() for spec in args.input.split(",") if spec.strip()]
    tokenizer = _cli_tokenizer(args, inputs)
    manifest = prepare(inputs, args.format, args.output, tokenizer,
                       documents_per_shard=args.documents_per_shard, workers=args.workers,
                       progress=not args.no_progress, max_line_chars=args.max_line_chars)
    print(summary(manifest, args.output))


if __name__ == "__main__":
    main(sys.argv[1:])
