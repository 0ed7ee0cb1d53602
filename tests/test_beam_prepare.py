"""Preparation as an Apache Beam pipeline (`--runner`), on the DirectRunner's engine: the local
preparation's corpus byte for byte (every shard file, the tokenizer, the plan, the manifest but
the fields naming the runner and timing it); bad runners and options refused in one line, exit 2,
before anything is written; an existing output never overwritten."""

import gzip
import hashlib
import json
import os
import sys

import pytest

from bertjax.data import corpus
from cli_in_process import run

pytestmark = pytest.mark.slow

# What differs between two preparations of one corpus: the runner's name, and the clock.
RUN_FIELDS = ("runner", "seconds", "tokens_per_sec")
SHARD_DOCUMENTS = 7


@pytest.fixture(scope="module")
def two_inputs(tmp_path_factory, demo_articles):
    """Real Wikipedia articles in two files (the second gzipped, with a line that is not UTF-8),
    so that documents cross inputs and shard boundaries and the sources' counts add up."""
    return write_two_inputs(tmp_path_factory.mktemp("inputs"), demo_articles)


def write_two_inputs(root, demo_articles):
    """The two inputs' files in `root`, comma-separated."""
    first = root / "a.txt"
    first.write_text("\n\n".join("\n".join(d) for d in demo_articles[:23]) + "\n",
                     encoding="utf-8")
    second = root / "b.txt.gz"
    with gzip.open(second, "wb") as f:
        f.write(("\n\n".join("\n".join(d) for d in demo_articles[23:40]) + "\n").encode())
        f.write(b"caf\xe9 in Latin-1, skipped\n")
    return f"{first},{second}"


def prepare(inputs, output, vocab, *extra):
    return run("data.prepare", "--input", inputs, "--output", str(output), "--vocab", vocab,
               "--documents-per-shard", str(SHARD_DOCUMENTS), "--no-progress", *extra)


def file_hashes(directory):
    """sha256 of every file of a prepared corpus but its manifest (and the lock, empty)."""
    hashes = {}
    for root, _, files in os.walk(directory):
        for name in files:
            path = os.path.join(root, name)
            relative = os.path.relpath(path, directory)
            if relative not in (corpus.MANIFEST, ".lock"):
                with open(path, "rb") as f:
                    hashes[relative] = hashlib.sha256(f.read()).hexdigest()
    return hashes


def manifest(directory):
    with open(os.path.join(directory, corpus.MANIFEST)) as f:
        return json.load(f)


def test_the_direct_runner_prepares_the_local_corpus_byte_for_byte(two_inputs, small_corpus_dir,
                                                                   tmp_path):
    vocab = os.path.join(small_corpus_dir, corpus.TOKENIZER_DIR)
    local = prepare(two_inputs, tmp_path / "local", vocab, "--workers", "2")
    assert local.returncode == 0, local.stderr
    beam = prepare(two_inputs, tmp_path / "beam", vocab, "--runner=direct",
                   "--direct_num_workers=2", "--direct_running_mode=multi_processing")
    assert beam.returncode == 0 and beam.stderr == "", beam.stderr
    local_files, beam_files = file_hashes(tmp_path / "local"), file_hashes(tmp_path / "beam")
    shards = [f for f in local_files if f.startswith(corpus.SHARDS_DIR + os.sep)]
    assert len(shards) == 4 * 6 and "plan.json" in local_files  # 40 documents, 7 a shard
    assert beam_files == local_files
    local_manifest, beam_manifest = manifest(tmp_path / "local"), manifest(tmp_path / "beam")
    assert "runner" not in local_manifest and beam_manifest["runner"] == "direct"
    assert local_manifest["source"]["skipped_lines"] == {"invalid_utf8": 1}
    assert ({k: v for k, v in beam_manifest.items() if k not in RUN_FIELDS}
            == {k: v for k, v in local_manifest.items() if k not in RUN_FIELDS})
    assert f"in {len(shards) // 4} shards" in beam.stdout

    # Run again on the finished corpus: nothing is rewritten.
    before = snapshot(tmp_path / "beam")
    again = prepare(two_inputs, tmp_path / "beam", vocab, "--runner=direct")
    assert again.returncode == 0 and snapshot(tmp_path / "beam") == before


def test_a_pipeline_finishes_an_interrupted_preparation(two_inputs, small_corpus_dir, tmp_path):
    """Shards a killed run completed are kept; the pipeline writes the rest, the same bytes."""
    vocab = os.path.join(small_corpus_dir, corpus.TOKENIZER_DIR)
    assert prepare(two_inputs, tmp_path / "whole", vocab, "--workers", "1").returncode == 0
    beam = tmp_path / "beam"
    assert prepare(two_inputs, beam, vocab, "--runner=direct").returncode == 0
    os.remove(beam / corpus.MANIFEST)
    for index in (1, 5):
        for name in os.listdir(corpus.shard_path(str(beam), index)):
            os.remove(os.path.join(corpus.shard_path(str(beam), index), name))
        os.rmdir(corpus.shard_path(str(beam), index))
    kept = os.stat(corpus.shard_path(str(beam), 0)).st_mtime_ns
    finished = prepare(two_inputs, beam, vocab, "--runner=direct")
    assert finished.returncode == 0, finished.stderr
    assert os.stat(corpus.shard_path(str(beam), 0)).st_mtime_ns == kept
    assert file_hashes(beam) == file_hashes(tmp_path / "whole")
    written = manifest(beam)["tokens_per_sec"] * manifest(beam)["seconds"]
    assert 0 < written < manifest(beam)["tokens"]  # only the two shards written again count


def snapshot(directory):
    entries = []
    for root, dirs, files in os.walk(directory):
        for name in dirs + files:
            st = os.stat(os.path.join(root, name))
            entries.append((os.path.relpath(os.path.join(root, name), directory), st.st_size,
                            st.st_mtime_ns))
    return sorted(entries)


# (what is passed besides the inputs, output and vocabulary; what the one line says)
REFUSED = [
    (["--runner=nope"], "argument --runner: invalid choice: 'nope'"),
    (["--runner=direct", "--no_such_option=1"], "unknown options (neither the command's nor "
                                                "Beam's): --no_such_option"),
    (["--runner=direct", "--direct_num_workers=many"], "--direct_num_workers: invalid int value"),
    (["--direct_num_workers=2"], "unrecognized arguments: --direct_num_workers=2"),
    (["--runner=direct", "--workers=2"], "with --runner, set the runner's own"),
    (["--runner=dataflow", "--project=my-project", "--region=europe-west4",
      "--temp_location=/tmp/beam"], "bad options for the dataflow runner: "
                                    "--temp_location=gs://BUCKET/PATH is needed"),
    (["--runner=dataflow", "--region=europe-west4", "--temp_location=gs://my-bucket/tmp"],
     "bad options for the dataflow runner: Missing required option: project."),
    (["--runner=dataflow", "--project=NotAProject", "--region=europe-west4",
      "--temp_location=gs://my-bucket/tmp"], "Invalid Project ID (NotAProject)"),
    (["--runner=dataflow", "--project=my-project", "--region=europe-west4",
      "--temp_location=gs://my-bucket/tmp"], "Dataflow's workers see Cloud Storage only: "
                                             "--input and --output must be gs:// URLs"),
]


@pytest.mark.parametrize("extra, message", REFUSED, ids=[" ".join(c[0]) for c in REFUSED])
def test_bad_runners_and_options_are_refused_before_anything_is_written(
        extra, message, two_inputs, small_corpus_dir, tmp_path):
    vocab = os.path.join(small_corpus_dir, corpus.TOKENIZER_DIR)
    refused = prepare(two_inputs, tmp_path / "out", vocab, *extra)
    assert refused.returncode == 2, refused.stderr
    assert refused.stderr.startswith("bertjax: error: ") and refused.stderr.count("\n") == 1, \
        refused.stderr
    assert message in refused.stderr, refused.stderr
    assert not (tmp_path / "out").exists()


def test_an_existing_output_is_not_overwritten(two_inputs, small_corpus_dir, demo_articles,
                                               tmp_path):
    vocab = os.path.join(small_corpus_dir, corpus.TOKENIZER_DIR)
    other = tmp_path / "other.txt"
    other.write_text("\n".join(demo_articles[50]) + "\n", encoding="utf-8")
    prepared = tmp_path / "prepared"
    assert prepare(str(other), prepared, vocab, "--runner=direct").returncode == 0
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    for output, message in ((prepared, "holds a prepared corpus of other inputs"),
                            (taken, "refusing to write into it")):
        before = snapshot(output)
        refused = prepare(two_inputs, output, vocab, "--runner=direct")
        assert refused.returncode == 2 and message in refused.stderr, refused.stderr
        assert refused.stderr.count("\n") == 1 and snapshot(output) == before


def test_a_worker_that_cannot_read_an_input_fails_the_run_in_one_line(small_corpus_dir,
                                                                       tmp_path):
    truncated = tmp_path / "cut.txt.gz"
    whole = gzip.compress(b"one sentence.\n" * 20_000)
    truncated.write_bytes(whole[:len(whole) // 2])
    vocab = os.path.join(small_corpus_dir, corpus.TOKENIZER_DIR)
    failed = prepare(str(truncated), tmp_path / "out", vocab, "--runner=direct")
    assert failed.returncode == 2 and failed.stderr.count("\n") == 1, failed.stderr
    assert failed.stderr.startswith(f"bertjax: error: cannot read {truncated}"), failed.stderr
    assert not (tmp_path / "out").exists()  # nothing written: no plan ties it to the bad input


def test_without_the_beam_extra_the_runner_is_refused_in_one_line(two_inputs, small_corpus_dir,
                                                                  tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "apache_beam", None)  # makes `import apache_beam` fail
    vocab = os.path.join(small_corpus_dir, corpus.TOKENIZER_DIR)
    refused = prepare(two_inputs, tmp_path / "out", vocab, "--runner=direct")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert ("preparing with --runner=direct needs the beam extra (apache_beam is not installed): "
            "pip install 'bertjax[beam]'") in refused.stderr
    assert not (tmp_path / "out").exists()



def test_an_empty_corpus_is_refused_and_leaves_nothing(small_corpus_dir, tmp_path):
    blank = tmp_path / "blank.txt"
    blank.write_text("\n\n\n")
    vocab = os.path.join(small_corpus_dir, corpus.TOKENIZER_DIR)
    refused = prepare(str(blank), tmp_path / "out", vocab, "--runner=direct")
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert f"the corpus is empty: no document in {blank}" in refused.stderr
    assert not (tmp_path / "out").exists()
