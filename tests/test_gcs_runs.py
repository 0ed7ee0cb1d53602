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
from bertjax.core import storage, transfer
from bertjax.inference import loading
from bertjax.train.bucket_lock import BucketLock
from cli_in_process import run as run_in_process
from pretrain_runs import CHILD, REPO, SHORT, child_env, run_child, tiny_args
from trees import flat


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

    # The dead run's lease is stale only after minutes: a second run is refused meanwhile.
    busy = run_child(args)
    _one_line(busy, "is in use by pid", workdir)
    with BucketLock(workdir, stale_s=0):  # taken over as once the lease expires, then released
        pass
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
            timeout=240, env=child_env(STOP_PID_AFTER_CHECKPOINT=f"{gcs.proc.pid}:3",
                                       BERTJAX_STORAGE_TIMEOUT="3"))
    finally:
        gcs.resume()
    assert time.monotonic() - started < 200
    assert frozen.returncode == 2, frozen.stderr[-3000:]
    assert "Traceback" not in frozen.stderr and frozen.stderr.count("bertjax: error:") == 1
    error = frozen.stderr.strip().splitlines()[-1]
    assert error.startswith("bertjax: error:") and "did not answer within 3s" in error, error
    assert "checkpoint 6 was not saved, checkpoint 3 stays restorable" in error, error
    assert loading.checkpoint_steps(workdir) == [3]
    with BucketLock(workdir, stale_s=0):  # the frozen run could not delete its lease
        pass
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
