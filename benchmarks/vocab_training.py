"""Vocabulary training time on a sample: the single-machine step before a corpus is prepared
(on this machine or as a Beam pipeline), as `prepare --train-vocab` runs it.

The sample is the first `--max-train-sentences` sentences of the corpus (10,000,000 by default);
here it is the Wikipedia demo corpus repeated `--repeat` times, trained into a 30,522-token
vocabulary of each kind asked for. Repeats add words, not distinct ones: the time of the counting
pass grows with the sample's words, the merges' with its distinct words. Prints, for each sample:
sentences, words, seconds, words/s and the process's peak memory.

    python benchmarks/vocab_training.py [--repeat 1,4] [--kinds wordpiece] [--vocab-size 30522]
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time

from bertjax.data.demo_corpus import demo_corpus_path
from bertjax.data.tokenizer_training import TOKENIZER_KINDS, build_tokenizer


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeat", default="1,4", help="copies of the demo corpus, per sample")
    parser.add_argument("--kinds", default="wordpiece", help=f"of {', '.join(TOKENIZER_KINDS)}")
    parser.add_argument("--vocab-size", type=int, default=30522)
    args = parser.parse_args()

    with open(demo_corpus_path(), encoding="utf-8") as f:
        text = f.read().rstrip("\n") + "\n"
    sentences = [line for line in text.split("\n") if line]
    words = sum(len(s.split()) for s in sentences)
    work = tempfile.mkdtemp(prefix="bertjax-vocab-")
    try:
        print(f"{os.cpu_count()} cores; vocabulary of {args.vocab_size:,} tokens")
        for repeat in (int(r) for r in args.repeat.split(",")):
            path = os.path.join(work, f"wiki-x{repeat}.txt")
            with open(path, "w", encoding="utf-8") as f:
                f.write("\n".join([text] * repeat))
            for kind in args.kinds.split(","):
                start = time.perf_counter()
                build_tokenizer([path], "sentences", kind, args.vocab_size)
                seconds = time.perf_counter() - start
                peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
                print(f"{kind:13s} demo Wikipedia x{repeat}: {len(sentences) * repeat:9,} "
                      f"sentences {words * repeat:11,} words {seconds:7.1f} s "
                      f"{words * repeat / seconds:11,.0f} words/s  peak {peak:,.0f} MiB")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
