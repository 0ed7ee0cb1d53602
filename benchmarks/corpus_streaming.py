"""What a pretraining run fetches from a prepared corpus on a bucket, and how long its steps wait
for data: a real run (`python -m bertjax.main`, configs/tiny.py) reading a synthetic prepared
corpus from the GCS emulator (tests/gcs_emulator.py) in place.

    .venv/bin/python benchmarks/corpus_streaming.py [--megabytes 20] [--steps 40] [--batch 32]

Prints the corpus's token bytes, the index the run fetched once, the bytes its rows read per step
(planned exactly as the run plans them) and the ranged requests that takes, the bytes fetched per step (metrics.jsonl
data_bytes_fetched), what the server sent in all (counted by the server), and the data wait per
step (metrics.jsonl data_wait_s; the first step and each phase's first step aside).
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import subprocess
import sys
import tempfile

import numpy as np

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(REPO, "tests"))

from gcs_emulator import GcsEmulator, environment_of  # noqa: E402

from bertjax.core import storage  # noqa: E402
from bertjax.data import corpus, read_ahead, streamed_corpus  # noqa: E402
from bertjax.data.tokenizer_training import train_wordpiece  # noqa: E402
from bertjax.jobs import pretraining_data  # noqa: E402
from bertjax.settings import pretrain  # noqa: E402


def synthetic_corpus(directory: str, megabytes: int) -> int:
    """Random token ids (uint16) in 4 shards, documents of 2-30 sentences of 5-60 tokens, with a
    1,000-token WordPiece vocabulary; returns the bytes of the shards' tokens.npy."""
    rng = np.random.default_rng(0)
    stats = []
    for shard in range(4):
        documents, total = [], 0
        while total < megabytes * (1 << 20) // 8:
            documents.append([rng.integers(5, 1000, int(n), dtype=np.int32)
                              for n in rng.integers(5, 61, int(rng.integers(2, 31)))])
            total += sum(len(s) for s in documents[-1])
        stats.append(corpus.write_shard(directory, shard, documents, 1000))
    words = [" ".join(f"w{i % 997}" for i in range(j, j + 12)) for j in range(3000)]
    train_wordpiece(words, vocab_size=1000).save(os.path.join(directory, corpus.TOKENIZER_DIR))
    corpus.write_manifest(directory, stats, 1000)
    return sum(os.path.getsize(os.path.join(corpus.shard_path(directory, i), "tokens.npy"))
               for i in range(4))


def run_args(workdir: str, url: str, steps: int, batch: int) -> list[str]:
    settings = {"data.prepared": url, "data.workers": 1, "train.steps": steps,
                "train.batch_size": batch, "schedule.short_seq_len": 128,
                "schedule.short_max_predictions": 20, "schedule.long_fraction": 0.0,
                "train.log_every": 1, "train.checkpoint_every": 0, "train.eval_every": 0}
    return ["bertjax.main", f"--config={REPO}/configs/tiny.py", f"--workdir={workdir}"] + [
        f"--config.{k}={v}" for k, v in settings.items()]


def rows_per_step(args: list[str], url: str, steps: int) -> tuple[list[int], list[int]]:
    """The bytes of the token ranges each step's rows read, planned as the run plans them, and
    the ranged requests each step's reads take (ranges merged as the run merges them)."""
    spec = importlib.util.spec_from_file_location("tiny", os.path.join(REPO, "configs/tiny.py"))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    config = module.get_config()
    for arg in args[3:]:
        key, value = arg.removeprefix("--config.").split("=", 1)
        section, name = key.split(".")
        config[section][name] = type(config[section][name])(value)
    settings = pretrain.read(config)
    data = pretraining_data.batches(settings, streamed_corpus.open_streamed(url))
    planner = read_ahead._copy_of(data._train)
    shards = planner.source.corpus.shards
    nbytes = [read_ahead.rows_bytes(read_ahead.fetch_now(planner, *data.local_slice(step)))
              for step in range(steps)]
    requests = [len(streamed_corpus.coalesced(shards, read_ahead.planned_ranges(
        planner, *data.local_slice(step)))) for step in range(steps)]
    return nbytes, requests


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=20)
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--batch", type=int, default=32)
    flags = parser.parse_args()
    with tempfile.TemporaryDirectory() as root, GcsEmulator() as server, \
            environment_of(server, 60):
        storage.bound_gcs_requests()
        directory = os.path.join(root, "corpus")
        token_bytes = synthetic_corpus(directory, flags.megabytes)
        server.create_bucket("bench")
        fs, _ = storage.filesystem("gs://bench/corpus")
        fs.put(directory + "/", "bench/corpus", recursive=True)
        url, workdir = "gs://bench/corpus", os.path.join(root, "wd")
        args = run_args(workdir, url, flags.steps, flags.batch)
        before = server.body_bytes_sent()
        done = subprocess.run([sys.executable, "-m", *args], cwd=REPO, capture_output=True,
                              text=True)
        if done.returncode:
            sys.exit(done.stderr[-3000:])
        sent = server.body_bytes_sent() - before
        index_bytes = streamed_corpus.open_streamed(url).index_bytes
        rows, requests = rows_per_step(args, url, flags.steps)
        with open(os.path.join(workdir, "metrics.jsonl")) as f:
            train = [r for r in map(json.loads, f) if "loss" in r]
    fetched = [r["data_bytes_fetched"] for r in train]
    waited = [r["data_wait_s"] for r in train if "step_time_s" in r]
    steps = len(train)
    print(f"corpus: {token_bytes:,} B of tokens (uint16); index fetched once: {index_bytes:,} B")
    print(f"{steps} steps of {flags.batch} rows x 128 tokens (objective bert, data.workers=1, "
          "read_ahead_steps and cache_mb at their defaults)")
    print(f"rows read per step: mean {np.mean(rows):,.0f} B; fetched per step: mean "
          f"{sum(fetched) / steps:,.0f} B ({sum(fetched) / sum(rows):.3f} x the rows)")
    print(f"ranged requests per step: mean {np.mean(requests):.1f} "
          f"({np.mean(requests) / flags.batch:.2f} a row)")
    print(f"server sent in all: {sent:,} B = {sent / token_bytes:.4f} of the corpus's tokens "
          f"(index, tokenizer, rows, run records)")
    print(f"data wait per step: median {np.median(waited) * 1e3:.2f} ms, p90 "
          f"{np.percentile(waited, 90) * 1e3:.2f} ms, max {max(waited) * 1e3:.2f} ms; step time "
          f"median {np.median([r['step_time_s'] for r in train if 'step_time_s' in r]):.3f} s")


if __name__ == "__main__":
    main()
