"""Preparation as a Beam pipeline with gs:// inputs and a gs:// output (what Dataflow's workers
see), on the DirectRunner's engine against the local GCS server: each worker fetches its inputs
and uploads its shards into the bucket; the corpus there is the local preparation's, byte for
byte (every shard file, the tokenizer), the manifest too but for the runner, the clock and where
the inputs were read from; an interrupted run finishes, keeping the shards complete there."""

import gzip
import hashlib
import json
import os

import pytest

from bertjax.core import storage, transfer
from bertjax.data import beam_storage, corpus
from bertjax.data.beam_preparation import SOURCE_STATS
from test_beam_prepare import RUN_FIELDS, manifest, prepare, write_two_inputs

pytestmark = pytest.mark.gcs

# Where the inputs were read from: local copies for the local preparation, object URLs for the
# pipeline's workers.
WHERE_FIELDS = ("inputs", "plan", "fingerprint")


def remote_hashes(url):
    """sha256 of every object of a prepared corpus on a bucket but its manifest."""
    return {name: hashlib.sha256(storage.read_bytes(storage.join(url, name))).hexdigest()
            for name in transfer.remote_files(url) if name != corpus.MANIFEST}


def local_hashes(directory):
    hashes = {}
    for root, _, files in os.walk(directory):
        for name in files:
            relative = os.path.relpath(os.path.join(root, name), directory)
            if relative not in (corpus.MANIFEST, ".lock"):
                with open(os.path.join(root, name), "rb") as f:
                    hashes[relative] = hashlib.sha256(f.read()).hexdigest()
    return hashes


def upload_inputs(bucket, two_inputs):
    for path in two_inputs.split(","):
        with open(path, "rb") as f:
            storage.write_bytes(f"gs://{bucket}/text/{os.path.basename(path)}", f.read())
    return f"gs://{bucket}/text/*"


@pytest.fixture(scope="module")
def two_inputs(tmp_path_factory, demo_articles):
    return write_two_inputs(tmp_path_factory.mktemp("inputs"), demo_articles)


@pytest.fixture(scope="module")
def local_corpus(two_inputs, small_corpus_dir, tmp_path_factory):
    output = tmp_path_factory.mktemp("local") / "prepared"
    vocab = os.path.join(small_corpus_dir, corpus.TOKENIZER_DIR)
    done = prepare(two_inputs, output, vocab, "--workers", "1")
    assert done.returncode == 0, done.stderr
    return output


def test_the_pipeline_prepares_the_local_corpus_on_a_bucket(gcs_bucket, two_inputs, local_corpus,
                                                            small_corpus_dir):
    vocab = os.path.join(small_corpus_dir, corpus.TOKENIZER_DIR)
    target = f"gs://{gcs_bucket}/prepared"
    beam = prepare(upload_inputs(gcs_bucket, two_inputs), target, vocab, "--runner=direct",
                   "--direct_num_workers=2", "--direct_running_mode=multi_processing")
    assert beam.returncode == 0 and beam.stderr == "", beam.stderr
    local, remote = local_hashes(local_corpus), remote_hashes(target)
    assert sorted(remote) == sorted(local) and len(local) > 4 * 6  # 6 shards, tokenizer, plan
    assert {k: v for k, v in remote.items() if k != "plan.json"} == \
        {k: v for k, v in local.items() if k != "plan.json"}
    assert not storage.exists(storage.join(target, SOURCE_STATS))

    remote_manifest = json.loads(storage.read_bytes(storage.join(target, corpus.MANIFEST)))
    local_manifest = manifest(local_corpus)
    assert remote_manifest["runner"] == "direct"
    assert remote_manifest["source"]["skipped_lines"] == {"invalid_utf8": 1}
    skipped = RUN_FIELDS + WHERE_FIELDS
    assert ({k: v for k, v in remote_manifest.items() if k not in skipped}
            == {k: v for k, v in local_manifest.items() if k not in skipped})
    assert ({k: v for k, v in remote_manifest["plan"].items() if k not in ("inputs", "fingerprint")}
            == {k: v for k, v in local_manifest["plan"].items()
                if k not in ("inputs", "fingerprint")})
    assert [i["url"] for i in remote_manifest["plan"]["inputs"]] == \
        [f"gs://{gcs_bucket}/text/a.txt", f"gs://{gcs_bucket}/text/b.txt.gz"]
    assert f"prepared {target}: 40 documents" in beam.stdout

    # Run again on the finished corpus: nothing is rewritten.
    before = transfer.remote_files(target)
    again = prepare(f"gs://{gcs_bucket}/text/*", target, vocab, "--runner=direct")
    assert again.returncode == 0 and again.stderr == "", again.stderr
    assert f"prepared {target}: 40 documents" in again.stdout
    assert transfer.remote_files(target) == before


def test_an_interrupted_pipeline_finishes_on_the_bucket_keeping_complete_shards(
        gcs_bucket, two_inputs, local_corpus, small_corpus_dir):
    vocab = os.path.join(small_corpus_dir, corpus.TOKENIZER_DIR)
    inputs, target = upload_inputs(gcs_bucket, two_inputs), f"gs://{gcs_bucket}/prepared"
    assert prepare(inputs, target, vocab, "--runner=direct").returncode == 0
    # As a killed run leaves it: no manifest, shard 1 never written, shard 3 half uploaded.
    storage.remove(storage.join(target, corpus.MANIFEST))
    storage.remove(beam_storage.shard_url(target, 1))
    storage.remove(storage.join(beam_storage.shard_url(target, 3), beam_storage.COMPLETE_MARKER))
    kept = transfer.remote_files(beam_storage.shard_url(target, 0))

    finished = prepare(inputs, target, vocab, "--runner=direct")
    assert finished.returncode == 0 and finished.stderr == "", finished.stderr
    assert transfer.remote_files(beam_storage.shard_url(target, 0)) == kept  # same generations
    local = local_hashes(local_corpus)
    assert {k: v for k, v in remote_hashes(target).items() if k != "plan.json"} == \
        {k: v for k, v in local.items() if k != "plan.json"}
    written = json.loads(storage.read_bytes(storage.join(target, corpus.MANIFEST)))
    assert 0 < written["tokens_per_sec"] * written["seconds"] < written["tokens"]


def test_a_bucket_holding_another_preparation_is_refused_untouched(
        gcs_bucket, two_inputs, small_corpus_dir):
    vocab = os.path.join(small_corpus_dir, corpus.TOKENIZER_DIR)
    target = f"gs://{gcs_bucket}/prepared"
    storage.write_bytes(storage.join(target, "plan.json"), b'{"fingerprint": "another"}\n')
    before = transfer.remote_files(target)
    refused = prepare(upload_inputs(gcs_bucket, two_inputs), target, vocab, "--runner=direct")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "holds an unfinished preparation of other inputs" in refused.stderr
    assert transfer.remote_files(target) == before


def test_a_worker_that_cannot_read_an_input_on_the_bucket_fails_in_one_line_leaving_nothing(
        gcs_bucket, small_corpus_dir):
    whole = gzip.compress(b"one sentence.\n" * 20_000)
    storage.write_bytes(f"gs://{gcs_bucket}/cut.txt.gz", whole[:len(whole) // 2])
    vocab = os.path.join(small_corpus_dir, corpus.TOKENIZER_DIR)
    target = f"gs://{gcs_bucket}/prepared"
    # Workers in processes of their own, as a cluster's: this process knows nothing of their copies.
    failed = prepare(f"gs://{gcs_bucket}/cut.txt.gz", target, vocab, "--runner=direct",
                     "--direct_num_workers=2", "--direct_running_mode=multi_processing")
    assert failed.returncode == 2 and failed.stderr.count("\n") == 1, failed.stderr
    assert failed.stderr.startswith(f"bertjax: error: cannot read gs://{gcs_bucket}/cut.txt.gz"), \
        failed.stderr  # named by its URL, not by the worker's copy
    assert not storage.exists(target)  # no plan ties the output to the bad input
