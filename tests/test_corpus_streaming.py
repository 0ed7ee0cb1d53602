"""A prepared corpus on a bucket read in place (bertjax/data/streamed_corpus.py, read_ahead.py),
against the GCS emulator: the same batches and losses as from a local copy, only the bytes the
rows need fetched (counted by the client and by the server), and a server gone mid-run is one
line and exit status 2 with the last checkpoint restorable."""

import json
import os
import shutil
import subprocess
import sys
import time

import fsspec
import numpy as np
import pytest

import cli_in_process
from gcs_emulator import GcsEmulator
from pretrain_runs import REPO, SHORT, child_env, tiny_args

from bertjax.core import storage
from bertjax.data import corpus, read_ahead, streamed_corpus
from bertjax.data.length_schedule import LengthSchedule
from bertjax.data.masking_config import MaskingConfig
from bertjax.data.pretraining import PretrainingData
from bertjax.jobs.workdir_mirror import WorkdirMirror
from bertjax.train.checkpoint import Checkpointer

pytestmark = pytest.mark.gcs

TWO_PHASES = LengthSchedule.bert(10, long_fraction=0.3, short=(32, 5), long=(64, 10))
# Bytes fetched for a run's steps, at most this multiple of the bytes its rows read: ranges of a
# step closer than MERGE_GAP_BYTES are fetched as one, and read ahead fetches whole steps.
FETCH_FACTOR = 2.0
TIMEOUT_S = 3  # BERTJAX_STORAGE_TIMEOUT of the run whose server dies
MARGIN_S = 30  # a run's end after its deadline: the watchdog's poll, the exit


def upload(local_dir: str, url: str) -> int:
    """The tree at `local_dir` put at `url`; returns the bytes of its shards' tokens.npy."""
    fs = fsspec.filesystem("gs")
    fs.put(local_dir.rstrip("/") + "/", url.removeprefix("gs://"), recursive=True)
    return sum(os.path.getsize(os.path.join(root, name))
               for root, _, names in os.walk(local_dir) for name in names if name == "tokens.npy")


def make_data(prepared, **overrides) -> PretrainingData:
    settings = dict(mode="nsp", masking=MaskingConfig(), schedule=TWO_PHASES, global_batch_size=8,
                    seed=3, workers=0, prefetch=2, read_ahead_steps=3, cache_mb=1)
    settings.update(overrides)
    return PretrainingData(prepared, **settings)


def assert_same_batches(got: list[dict], want: list[dict]) -> None:
    assert len(got) == len(want)
    for a, b in zip(got, want):
        assert a.keys() == b.keys()
        for key in b:
            assert a[key].dtype == b[key].dtype and a[key].tobytes() == b[key].tobytes(), key


@pytest.mark.parametrize("mode", ["nsp", "full_sentences", "documents"])
def test_streamed_batches_are_the_local_ones(gcs, gcs_bucket, small_corpus_dir, mode):
    url = f"gs://{gcs_bucket}/corpus"
    upload(small_corpus_dir, url)
    local = corpus.PreparedCorpus.open(small_corpus_dir)
    streamed = streamed_corpus.open_streamed(url)
    assert np.array_equal(streamed.sentence_bounds, local.sentence_bounds)
    assert np.array_equal(streamed.token_counts, local.token_counts)
    want_data, got_data = make_data(local, mode=mode), make_data(streamed, mode=mode)
    with want_data.train_iterator(0) as want_it, got_data.train_iterator(0, end_step=10) as got_it:
        want = [next(want_it) for _ in range(10)]
        got = [next(got_it) for _ in range(10)]
        assert got_it.counters()["data_bytes_fetched"] > 0
    assert_same_batches(got, want)
    phase = TWO_PHASES.phases[-1]
    assert_same_batches(got_data.eval_batches(phase, 2), want_data.eval_batches(phase, 2))
    # a resumed iterator (a jump) and slices read without read-ahead: the same batches
    with got_data.train_iterator(7) as resumed:
        assert_same_batches([next(resumed), next(resumed)], want[7:9])
    assert [e.input_ids.tolist() for e in got_data.examples(32, 5, 3)] == \
        [e.input_ids.tolist() for e in want_data.examples(32, 5, 3)]


def test_streamed_batches_built_in_worker_processes(gcs, gcs_bucket, small_corpus_dir):
    url = f"gs://{gcs_bucket}/corpus"
    upload(small_corpus_dir, url)
    want_data = make_data(corpus.PreparedCorpus.open(small_corpus_dir))
    got_data = make_data(streamed_corpus.open_streamed(url), workers=1)
    with want_data.train_iterator(0) as want_it, got_data.train_iterator(0, end_step=6) as got_it:
        assert_same_batches([next(got_it) for _ in range(6)], [next(want_it) for _ in range(6)])


def test_bytes_fetched_are_what_the_rows_read(gcs, gcs_bucket, small_corpus_dir):
    """N steps fetch at most FETCH_FACTOR times the bytes of the token ranges their rows read
    (client's count, and the server's, plus the index it sent once)."""
    url = f"gs://{gcs_bucket}/corpus"
    upload(small_corpus_dir, url)
    before_open = gcs.body_bytes_sent()
    streamed = streamed_corpus.open_streamed(url)
    opened = gcs.body_bytes_sent()
    data = make_data(streamed, mode="full_sentences")
    steps = 8
    rows = 0
    planner = read_ahead._copy_of(data._train)
    for step in range(steps):
        fetched = read_ahead.fetch_now(planner, *data.local_slice(step))
        rows += read_ahead.rows_bytes(fetched)
    before_run = gcs.body_bytes_sent()
    with data.train_iterator(0, end_step=steps) as batches:
        for _ in range(steps):
            next(batches)
        fetched = batches.counters()["data_bytes_fetched"]
    served = gcs.body_bytes_sent() - before_run
    print(f"\n{steps} steps of 8 rows: rows read {rows} B, fetched {fetched} B, server sent "
          f"{served} B; index {streamed.index_bytes} B (server: {opened - before_open} B with "
          "the tokenizer)")
    assert rows <= fetched <= FETCH_FACTOR * rows
    assert fetched <= served <= FETCH_FACTOR * rows
    assert streamed.index_bytes <= opened - before_open


def synthetic_corpus(root: str, tokenizer_dir: str, megabytes: int) -> str:
    """A prepared corpus of random token ids (uint16) whose tokens.npy weigh `megabytes` in all,
    in 4 shards, documents of 2-30 sentences of 5-60 tokens; the tokenizer is `tokenizer_dir`'s."""
    rng = np.random.default_rng(0)
    directory = os.path.join(root, "synthetic")
    tokens_per_shard = megabytes * (1 << 20) // 2 // 4
    stats = []
    for shard in range(4):
        documents, total = [], 0
        while total < tokens_per_shard:
            document = [rng.integers(5, 1000, int(n), dtype=np.int32)
                        for n in rng.integers(5, 61, int(rng.integers(2, 31)))]
            documents.append(document)
            total += sum(len(s) for s in document)
        stats.append(corpus.write_shard(directory, shard, documents, 1000))
    shutil.copytree(tokenizer_dir, os.path.join(directory, corpus.TOKENIZER_DIR))
    corpus.write_manifest(directory, stats, 1000)
    return directory


def run_pretraining(args, **env):
    return subprocess.run([sys.executable, "-m", *args], env=child_env(**env), cwd=REPO,
                          capture_output=True, text=True, timeout=600)


def losses(workdir: str) -> list[tuple[int, float]]:
    with open(os.path.join(workdir, "metrics.jsonl")) as f:
        records = [json.loads(line) for line in f]
    return [(r["step"], r["loss"]) for r in records if "loss" in r]


def test_a_run_on_the_bucket_trains_as_on_a_local_copy(gcs, gcs_bucket, small_corpus_dir,
                                                       tmp_path):
    url = f"gs://{gcs_bucket}/corpus"
    upload(small_corpus_dir, url)
    settings = {**SHORT, "data.workers": 1}
    local = run_pretraining(*[tiny_args(str(tmp_path / "local"), small_corpus_dir, **settings)])
    assert local.returncode == 0, local.stderr[-3000:]
    cache = tmp_path / "cache"  # the run's own: what it copied locally, and nothing else
    streamed = run_pretraining(*[tiny_args(str(tmp_path / "streamed"), url, **settings)],
                               BERTJAX_CACHE=str(cache))
    assert streamed.returncode == 0, streamed.stderr[-3000:]
    assert losses(str(tmp_path / "streamed")) == losses(str(tmp_path / "local"))
    with open(tmp_path / "streamed" / "metrics.jsonl") as f:
        train = [r for r in map(json.loads, f) if "loss" in r]
    assert all(r["data_wait_s"] >= 0 and r["data_bytes_fetched"] >= 0 for r in train)
    assert sum(r["data_bytes_fetched"] for r in train) > 0
    # no local copy of the corpus's shards was made
    copies = [root for root, _, names in os.walk(cache) if "tokens.npy" in names]
    assert os.path.isdir(cache) and not copies, copies


def test_a_20_mb_corpus_is_not_fetched_whole(gcs, gcs_bucket, small_corpus_dir, tmp_path):
    """A straight run of 12 steps reads its rows, not the corpus: the server sends less than half
    of the corpus's token bytes in all (index, tokenizer and rows)."""
    directory = synthetic_corpus(str(tmp_path), os.path.join(small_corpus_dir, "tokenizer"), 20)
    url = f"gs://{gcs_bucket}/big"
    corpus_bytes = upload(directory, url)
    before = gcs.body_bytes_sent()
    done = run_pretraining(*[tiny_args(str(tmp_path / "wd"), url, **{"train.eval_every": 0})])
    assert done.returncode == 0, done.stderr[-3000:]
    sent = gcs.body_bytes_sent() - before
    with open(tmp_path / "wd" / "metrics.jsonl") as f:
        train = [r for r in map(json.loads, f) if "loss" in r]
    fetched = sum(r["data_bytes_fetched"] for r in train)
    waited = [r["data_wait_s"] for r in train]
    print(f"\n20 MB corpus ({corpus_bytes} B of tokens), 12 steps of 8 rows: server sent {sent} B "
          f"({sent / corpus_bytes:.4f} of the corpus), rows fetched {fetched} B "
          f"({fetched / len(train):.0f} B a step); data wait a step: median "
          f"{np.median(waited) * 1e3:.2f} ms, max {max(waited) * 1e3:.2f} ms")
    assert sent < corpus_bytes / 2


@pytest.mark.parametrize("fault", ["kill", "pause"])
def test_a_server_gone_mid_run_is_one_line_and_the_last_checkpoint_restores(
        gcs, small_corpus_dir, tmp_path, fault):
    """The corpus's server killed (or frozen: SIGSTOP) once the run has written a checkpoint:
    one line, exit status 2, and the workdir's last checkpoint restores (a resume on a local
    copy finishes the run)."""
    with GcsEmulator() as server:
        server.create_bucket("dies")
        env = {**server.env(), "BERTJAX_STORAGE_TIMEOUT": TIMEOUT_S}
        fs = fsspec.filesystem("gs", endpoint_url=server.url, token="anon",
                               skip_instance_cache=True)
        fs.put(small_corpus_dir.rstrip("/") + "/", "dies/corpus", recursive=True)
        workdir = str(tmp_path / "wd")
        args = tiny_args(workdir, "gs://dies/corpus", **{**SHORT, "train.steps": 12,
                                                         "train.checkpoint_every": 3,
                                                         "data.read_ahead_steps": 1,
                                                         "data.prefetch": 1})
        # Killed once the first checkpoint is written: 9 of the 12 steps' reads still to come.
        process = subprocess.Popen([sys.executable, "-m", *args], env=child_env(**env), cwd=REPO,
                                   stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 300
        while not os.path.isdir(os.path.join(workdir, "checkpoints", "3")):
            assert process.poll() is None and time.time() < deadline, process.stderr.read()
            time.sleep(0.2)
        getattr(server, fault)()
        killed = time.time()
        _, stderr = process.communicate(timeout=300)
    lines = [line for line in stderr.splitlines() if line.strip()]
    assert process.returncode == 2, stderr[-3000:]
    assert lines[-1].startswith("bertjax: error: cannot read gs://dies/corpus/"), stderr[-3000:]
    assert "Traceback" not in stderr and stderr.count("bertjax: error:") == 1
    assert time.time() - killed < 3 * TIMEOUT_S + MARGIN_S
    print("\n" + "\n".join(lines[-4:]))
    with Checkpointer(workdir, keep=None, read_only=True) as saved:
        last = saved.latest_step()
    assert last is not None and 3 <= last < 12
    resumed = run_pretraining(*[tiny_args(workdir, small_corpus_dir,
                                          **{**SHORT, "train.steps": 12,
                                             "train.checkpoint_every": 3})])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert f"resuming from step {last}" in resumed.stderr


def test_a_cache_too_small_for_one_step_is_refused_before_the_workdir(tmp_path):
    workdir = tmp_path / "wd"
    done = cli_in_process.run("main", *tiny_args(str(workdir), "gs://any/corpus", **{
        "train.batch_size": 4096, "data.cache_mb": 1})[1:])
    assert done.returncode == 2 and not workdir.exists()
    assert done.stderr.splitlines() == [
        "bertjax: error: data.cache_mb 1 cannot hold one step's reads from a streamed corpus "
        "(up to 2 MiB for 4096 rows of 64 tokens); raise it"]


def test_a_workdir_on_a_bucket_checks_the_cache_of_the_corpus_it_would_stream(
        gcs, gcs_bucket, small_corpus_dir):
    """No data.prepared: the corpus is prepared into the workdir, and streamed from there once
    the workdir is on a bucket; a local corpus is memory-mapped, whatever the cache."""
    text = os.path.join(os.path.dirname(small_corpus_dir), "wiki40.txt")
    big = {"data.prepared": "", "data.input": text, "train.batch_size": 4096,
           "data.cache_mb": 1}
    workdir = f"gs://{gcs_bucket}/run"
    done = cli_in_process.run("main", *tiny_args(workdir, "", **big)[1:])
    assert done.returncode == 2 and not storage.exists(workdir)
    assert done.stderr.splitlines() == [
        "bertjax: error: data.cache_mb 1 cannot hold one step's reads from a streamed corpus "
        "(up to 2 MiB for 4096 rows of 64 tokens); raise it"]


def test_a_corpus_prepared_into_a_workdir_on_a_bucket_is_read_in_place_on_resume(
        gcs, gcs_bucket, small_corpus_dir, tmp_path):
    """Prepared into gs://.../run/data by the first run (uploaded with the workdir), then read in
    place by the resume (the mirror pulls it without its shards): the losses of the same run on a
    local workdir."""
    text = os.path.join(os.path.dirname(small_corpus_dir), "wiki40.txt")
    inputs = {"data.prepared": "", "data.input": text,
              "data.tokenizer": os.path.join(small_corpus_dir, "tokenizer")}
    workdir = f"gs://{gcs_bucket}/run"
    first = run_pretraining(*[tiny_args(workdir, "", **{**SHORT, **inputs, "train.steps": 3})])
    assert first.returncode == 0, first.stderr[-3000:]
    assert fsspec.filesystem("gs").exists(f"{gcs_bucket}/run/data/shards/shard-00000/tokens.npy")
    resumed = run_pretraining(*[tiny_args(workdir, "", **{**SHORT, **inputs})])
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from step 3" in resumed.stderr
    local = run_pretraining(*[tiny_args(str(tmp_path / "local"), "", **{**SHORT, **inputs})])
    assert local.returncode == 0, local.stderr[-3000:]
    records = [json.loads(line) for line in fsspec.filesystem("gs").cat_file(
        f"{gcs_bucket}/run/metrics.jsonl").splitlines()]
    assert [(r["step"], r["loss"]) for r in records if "loss" in r] == \
        losses(str(tmp_path / "local"))
    assert sum(r.get("data_bytes_fetched", 0) for r in records) > 0  # the resume streamed
    mirror = WorkdirMirror(workdir, 0).path
    assert os.path.exists(os.path.join(mirror, "data", corpus.MANIFEST))
    assert not os.path.exists(os.path.join(mirror, "data", corpus.SHARDS_DIR))


def test_a_corpus_on_a_bucket_of_another_vocabulary_is_refused_naming_its_url(
        gcs, gcs_bucket, small_corpus_dir, finetune_vocab_dir, tmp_path):
    url = f"gs://{gcs_bucket}/corpus"
    upload(small_corpus_dir, url)
    workdir = tmp_path / "wd"
    done = cli_in_process.run("main", *tiny_args(str(workdir), url, **{
        "data.tokenizer": finetune_vocab_dir})[1:])
    assert done.returncode == 2 and not workdir.exists()
    lines = done.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        f"bertjax: error: {url} was prepared with another vocabulary"), lines
