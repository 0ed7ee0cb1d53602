"""Corpus preparation: real text in, shards out that decode back to the tokenizer's own ids;
resumable after a crash or a SIGKILL; never touches a preparation of something else."""

import hashlib
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

from bertjax.data import corpus, shard_writing

from bertjax.cli import prepare as prepare_cli
from bertjax.data.corpus import PreparedCorpus
from bertjax.data.demo_corpus import demo_corpus_path
from bertjax.data.preparation_engine import prepare
from bertjax.data.tokenizer import WordPieceTokenizer
from bertjax.data.tokenizer_training import build_tokenizer
from bertjax.core.errors import UserError

SLICE_DOCUMENTS = 40
PY = sys.executable


@pytest.fixture(scope="module")
def wiki_slice(tmp_path_factory):
    """The first 40 articles of the Wikipedia demo corpus, in the "sentences" layout."""
    with open(demo_corpus_path(), encoding="utf-8") as f:
        documents = f.read().split("\n\n")[:SLICE_DOCUMENTS]
    path = tmp_path_factory.mktemp("slice") / "wiki40.txt"
    path.write_text("\n\n".join(documents) + "\n", encoding="utf-8")
    return str(path), [d.strip("\n").split("\n") for d in documents]


@pytest.fixture(scope="module")
def bert(bert_vocab_path):
    return WordPieceTokenizer.from_vocab_file(bert_vocab_path)


def shard_arrays(directory):
    """Every array of every shard, by file name, for exact comparisons."""
    arrays = {}
    shards_dir = os.path.join(directory, corpus.SHARDS_DIR)
    for shard in sorted(os.listdir(shards_dir)):
        for name in sorted(os.listdir(os.path.join(shards_dir, shard))):
            arrays[f"{shard}/{name}"] = np.load(os.path.join(shards_dir, shard, name))
    return arrays


def assert_same_corpus(a, b):
    left, right = shard_arrays(a), shard_arrays(b)
    assert left.keys() == right.keys()
    for key in left:
        assert left[key].dtype == right[key].dtype and np.array_equal(left[key], right[key]), key


def snapshot(directory):
    """(path, size, mtime, content hash) of everything under a directory."""
    entries = []
    for root, dirs, files in os.walk(directory):
        for name in sorted(dirs + files):
            path = os.path.join(root, name)
            st = os.stat(path)
            digest = ""
            if os.path.isfile(path):
                with open(path, "rb") as f:
                    digest = hashlib.sha256(f.read()).hexdigest()
            entries.append((os.path.relpath(path, directory), st.st_size, st.st_mtime_ns, digest))
    return sorted(entries)


@pytest.mark.slow
def test_prepare_real_text_decodes_to_the_tokenizers_ids(wiki_slice, bert, tmp_path, monkeypatch):
    path, documents = wiki_slice
    out = str(tmp_path / "prepared")
    manifest = prepare([path], "sentences", out, bert, documents_per_shard=7, workers=2,
                       progress=False)
    sentences = [s for d in documents for s in d]
    assert (manifest["documents"], manifest["sentences"]) == (SLICE_DOCUMENTS, len(sentences))
    assert len(manifest["shards"]) == 6 and manifest["shards"][-1]["documents"] == 5
    assert manifest["inputs"] == [path] and manifest["input_format"] == "sentences"
    assert manifest["source"]["skipped_lines"] == {} and manifest["tokens_per_sec"] > 0
    assert len(manifest["fingerprint"]) == 64

    prepared = PreparedCorpus.open(out)
    assert prepared.num_documents == SLICE_DOCUMENTS and prepared.num_sentences == len(sentences)
    expected = bert.encode_batch(sentences)
    assert prepared.num_tokens == manifest["tokens"] == sum(map(len, expected))
    for s, ids in enumerate(expected):
        np.testing.assert_array_equal(prepared.tokens(s, s + 1), ids)
    # Documents keep their sentences, in source order, across shard boundaries.
    for d in (0, 6, 7, 39):
        first, last = prepared.document_sentences(d)
        assert last - first == len(documents[d])
        text = prepared.tokenizer.decode(prepared.tokens(first, first + 1))
        assert text == bert.decode(bert.encode(documents[d][0]))
    np.testing.assert_array_equal(
        prepared.token_counts, np.bincount(np.concatenate(expected), minlength=bert.vocab_size))

    # Asking again for the same preparation does no work and gives the same manifest.
    def no_work(*args):
        raise AssertionError("a finished preparation was redone")

    monkeypatch.setattr(shard_writing, "tokenize_and_write", no_work)
    assert prepare([path], "sentences", out, bert, documents_per_shard=7, workers=1,
                   progress=False) == manifest


class SimulatedCrash(Exception):
    pass


@pytest.mark.slow
def test_resume_after_a_crash_mid_shard(wiki_slice, bert, tmp_path, monkeypatch):
    path, _ = wiki_slice
    reference, out = str(tmp_path / "reference"), str(tmp_path / "resumed")
    prepare([path], "sentences", reference, bert, documents_per_shard=4, workers=2, progress=False)

    real_write_shard = corpus.write_shard

    def crash_in_shard_3(directory, index, documents, vocab_size):
        if index == 3:  # die halfway through writing: a partial temporary directory stays
            partial = os.path.join(directory, corpus.SHARDS_DIR, ".shard-00003.tmp-crashed")
            os.makedirs(partial)
            np.save(os.path.join(partial, "tokens.npy"), np.zeros(3, np.uint16))
            raise SimulatedCrash()
        return real_write_shard(directory, index, documents, vocab_size)

    monkeypatch.setattr(corpus, "write_shard", crash_in_shard_3)
    with pytest.raises(SimulatedCrash):
        prepare([path], "sentences", out, bert, documents_per_shard=4, workers=1, progress=False)
    monkeypatch.setattr(corpus, "write_shard", real_write_shard)

    assert not os.path.exists(os.path.join(out, corpus.MANIFEST))
    assert [corpus.shard_is_complete(out, i) for i in range(5)] == [True] * 3 + [False] * 2
    with pytest.raises(UserError, match="no manifest.json"):
        PreparedCorpus.open(out)
    before = os.stat(corpus.shard_path(out, 0))

    prepare([path], "sentences", out, bert, documents_per_shard=4, workers=1, progress=False)
    assert_same_corpus(out, reference)
    assert os.stat(corpus.shard_path(out, 0)).st_ino == before.st_ino  # kept, not rewritten
    assert not [n for n in os.listdir(os.path.join(out, corpus.SHARDS_DIR)) if ".tmp-" in n]
    assert PreparedCorpus.open(out).num_documents == SLICE_DOCUMENTS


@pytest.mark.slow
def test_resume_after_sigkill_of_the_cli(wiki_slice, bert, bert_vocab_path, tmp_path):
    path, _ = wiki_slice
    out = str(tmp_path / "killed")
    command = [PY, "-m", "bertjax.data.prepare", "--input", path, "--output", out, "--vocab",
               bert_vocab_path, "--documents-per-shard", "1", "--workers", "2", "--no-progress"]
    process = subprocess.Popen(command, start_new_session=True, stdout=subprocess.DEVNULL,
                               stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not corpus.shard_is_complete(out, 2) and time.monotonic() < deadline:
            time.sleep(0.005)
    finally:
        os.killpg(process.pid, signal.SIGKILL)  # the CLI and its worker processes
        process.wait()
    assert corpus.shard_is_complete(out, 2)
    assert not os.path.exists(os.path.join(out, corpus.MANIFEST))
    complete = [i for i in range(SLICE_DOCUMENTS) if corpus.shard_is_complete(out, i)]
    assert len(complete) < SLICE_DOCUMENTS
    for i in complete:  # whatever looks complete is complete
        shard_writing.read_shard_stats(out, i)

    result = subprocess.run(command, capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith(f"prepared {out}: {SLICE_DOCUMENTS} documents")
    reference = str(tmp_path / "reference")
    prepare([path], "sentences", reference, bert, documents_per_shard=1, workers=1, progress=False)
    assert_same_corpus(out, reference)
    manifest = PreparedCorpus.open(out).manifest
    assert manifest["documents"] == SLICE_DOCUMENTS and len(manifest["shards"]) == SLICE_DOCUMENTS


def test_refuses_to_touch_other_preparations(wiki_slice, bert, tmp_path, monkeypatch):
    path, documents = wiki_slice
    out = str(tmp_path / "prepared")
    prepare([path], "sentences", out, bert, documents_per_shard=20, workers=1, progress=False)
    before = snapshot(out)
    other_text = tmp_path / "other.txt"
    other_text.write_text("Another corpus.\n")
    other_tokenizer = WordPieceTokenizer(bert._vocab, lowercase=False)
    attempts = [
        ([str(other_text)], "sentences", bert, 20, "inputs"),
        ([path], "paragraphs", bert, 20, "input format"),
        ([path], "sentences", other_tokenizer, 20, "tokenizer"),
        ([path], "sentences", bert, 10, "shard size"),
    ]
    for inputs, input_format, tokenizer, per_shard, difference in attempts:
        with pytest.raises(UserError, match=f"holds a prepared corpus of other {difference}"):
            prepare(inputs, input_format, out, tokenizer, documents_per_shard=per_shard,
                    workers=1, progress=False)
    assert snapshot(out) == before

    # An unfinished preparation (plan, some shards, no manifest) is protected the same way.
    unfinished = str(tmp_path / "unfinished")
    def crash(*args, **kwargs):
        raise SimulatedCrash()

    monkeypatch.setattr(corpus, "write_manifest", crash)
    with pytest.raises(SimulatedCrash):
        prepare([path], "sentences", unfinished, bert, documents_per_shard=20, workers=1,
                progress=False)
    before = snapshot(unfinished)
    with pytest.raises(UserError, match="holds an unfinished preparation of other inputs"):
        prepare([str(other_text)], "sentences", unfinished, bert, workers=1, progress=False)
    assert snapshot(unfinished) == before

    # A directory with something else in it is never written into.
    (tmp_path / "precious").mkdir()
    (tmp_path / "precious" / "thesis.tex").write_text("years of work")
    with pytest.raises(UserError, match="not empty and holds no preparation"):
        prepare([path], "sentences", str(tmp_path / "precious"), bert, progress=False)
    assert os.listdir(tmp_path / "precious") == ["thesis.tex"]


def test_skipped_lines_reach_the_manifest_and_output_inside_the_input(bert, tmp_path):
    corpus_dir = tmp_path / "corpus"
    corpus_dir.mkdir()
    (corpus_dir / "a.txt").write_bytes(b"Good line one.\nBad \xff line.\n" + b"x" * 300
                                       + b"\nGood line two.\n")
    out = str(corpus_dir / "prepared")  # inside the input directory: never read back as input
    for _ in range(2):
        manifest = prepare([str(corpus_dir)], "sentences", out, bert, max_line_chars=100,
                           workers=1, progress=False)
    assert manifest["source"]["skipped_lines"] == {"invalid_utf8": 1, "overlong": 1}
    assert (manifest["documents"], manifest["sentences"]) == (1, 2)
    assert prepare_cli.summary(manifest, out).endswith(
        "skipped lines: invalid_utf8=1, overlong=1")


def test_build_tokenizer(wiki_slice, tmp_path):
    path, documents = wiki_slice
    wordpiece = build_tokenizer([path], "sentences", "wordpiece", vocab_size=800,
                                max_sentences=2000)
    assert wordpiece.kind == "wordpiece" and 500 < wordpiece.vocab_size <= 800
    assert wordpiece.special.as_array().tolist() == [0, 1, 2, 3, 4]
    spm = build_tokenizer([path], "sentences", "sentencepiece", vocab_size=600,
                          lowercase=False, max_sentences=2000)
    assert spm.kind == "sentencepiece" and spm.vocab_size == 600 and not spm.lowercase
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n")
    for kind in ("wordpiece", "sentencepiece"):
        with pytest.raises(UserError, match="the corpus is empty"):
            build_tokenizer([str(empty)], "sentences", kind, vocab_size=100)
    with pytest.raises(UserError, match="unknown tokenizer kind"):
        build_tokenizer([path], "sentences", "unigram")


def run_cli(*args):
    return subprocess.run([PY, "-m", "bertjax.data.prepare", "--no-progress", *args],
                                capture_output=True, text=True, timeout=120)


@pytest.mark.slow
def test_cli_trains_a_vocabulary_and_reuses_it(wiki_slice, tmp_path):
    path, _ = wiki_slice
    out = str(tmp_path / "prepared")
    args = ("--input", path, "--output", out, "--train-vocab", "wordpiece", "--vocab-size", "600",
            "--documents-per-shard", "16", "--workers", "1")
    first = run_cli(*args)
    assert first.returncode == 0, first.stderr
    assert first.stdout.startswith(f"prepared {out}: {SLICE_DOCUMENTS} documents, ")
    assert " in 3 shards, " in first.stdout and first.stdout.rstrip().endswith(
        "skipped lines: none")
    before = snapshot(out)
    again = run_cli(*args)
    assert again.returncode == 0 and "using the tokenizer trained earlier" in again.stderr
    assert snapshot(out) == before
    assert PreparedCorpus.open(out).tokenizer.vocab_size <= 600


@pytest.mark.slow
def test_cli_bad_input_exits_2_with_one_line(wiki_slice, bert_vocab_path, tmp_path):
    path, _ = wiki_slice
    binary = tmp_path / "weights.bin"
    binary.write_bytes(b"\x00\x01" * 100)
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    cases = [
        (str(tmp_path / "missing.txt"), "input not found"),
        (str(binary), "looks binary"),
        (str(empty), "the corpus is empty"),
        (f"{path},{tmp_path / 'nope' / '*.txt'}", "no file matches"),
    ]
    out = tmp_path / "out"
    for inputs, message in cases:
        result = run_cli("--input", inputs, "--output", str(out), "--vocab", bert_vocab_path)
        assert result.returncode == 2, (inputs, result.stderr)
        assert result.stderr.count("\n") == 1 and "Traceback" not in result.stderr
        assert result.stderr.startswith("bertjax: error: ") and message in result.stderr
        assert not out.exists()  # a failed start leaves nothing that ties `out` to bad inputs
    result = run_cli("--input", path, "--output", str(taken), "--vocab", bert_vocab_path)
    assert result.returncode == 2 and "refusing to write into it" in result.stderr
    assert os.listdir(taken) == ["notes.txt"]
    result = run_cli("--input", path, "--output", str(out), "--format", "csv")
    assert result.returncode == 2 and result.stderr.startswith("bertjax: error: argument --format")
    assert result.stderr.count("\n") == 1
