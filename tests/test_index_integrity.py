"""A damaged index is one line on stderr and exit status 2, never a traceback or a wrong answer.

One real retrieval index (test_index's `built`: all-MiniLM-L6-v2 over Wikipedia passages, with
the FAISS graph) and one sense index (test_wsd's tiny model) are built once; each case damages a
copy the way a disk, an interrupted copy or a hand edit would, and runs the real command line.
"""

import json
import os
import shutil

import numpy as np
import pytest

from bertjax.cli import wsd as wsd_cli
from bertjax.retrieval import approximate, index, integrity
from bertjax.retrieval.bm25 import Bm25
from cli_checks import run_cli
# test_index's and test_wsd's fixtures, reused here (each still builds once per module)
from test_index import built, cached_models, run, wiki  # noqa: F401
from test_wsd import tiny_models  # noqa: F401


def assert_damaged(code, err):
    assert code == 2, err
    assert err.startswith("bertjax: error:") and err.count("\n") == 1, err
    assert "is damaged" in err and "rebuild it" in err, err
    assert "Traceback" not in err, err


def _write_json(path, value):
    with open(path, "w", encoding="utf-8") as f:
        json.dump(value, f)


def _edit_manifest(directory, edit):
    path = os.path.join(directory, index.MANIFEST)
    with open(path, encoding="utf-8") as f:
        manifest = json.load(f)
    edit(manifest)
    _write_json(path, manifest)


def _truncate(path):
    with open(path, "r+b") as f:
        f.truncate(os.path.getsize(path) // 2)


def _garbage_same_size(path):
    size = os.path.getsize(path)
    with open(path, "wb") as f:
        f.write(np.random.default_rng(0).bytes(size))


def _graph_of_a_smaller_index(directory):
    vectors = np.load(os.path.join(directory, index.VECTORS))[:10]
    approximate.save(approximate.build(vectors), os.path.join(directory, index.HNSW))


def _vectors_of_another_index(directory):
    """Same shape and dtype, other rows: what another index of as many documents would hold."""
    path = os.path.join(directory, index.VECTORS)
    vectors = np.load(path)
    np.save(path, vectors[::-1].copy())


def _one_document_edited(directory):
    """One letter of one text changed: valid JSON of the same size, other content."""
    path = os.path.join(directory, index.DOCUMENTS)
    with open(path, encoding="utf-8") as f:
        lines = f.readlines()
    record = json.loads(lines[3])
    record["text"] = ("X" if record["text"][0] != "X" else "Y") + record["text"][1:]
    lines[3] = json.dumps(record, ensure_ascii=False) + "\n"
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(lines)


def _bytes_appended(path):
    with open(path, "ab") as f:
        f.write(b"\0" * 64)


def _with_its_record_rewritten(damage):
    """`damage` to the graph, and the manifest's record of it rewritten to match (as a copy of
    another index's graph and its record would be): only FAISS or the counts can tell."""

    def damage_both(directory):
        damage(directory)
        record = integrity.file_record(os.path.join(directory, index.HNSW))
        _edit_manifest(directory, lambda m: m["files"].__setitem__(index.HNSW, record))

    return damage_both


DAMAGE = {
    "hnsw truncated": lambda d: _truncate(os.path.join(d, index.HNSW)),
    "hnsw garbage of the same size": lambda d: _garbage_same_size(os.path.join(d, index.HNSW)),
    "hnsw of a smaller index": _graph_of_a_smaller_index,
    "hnsw garbage, recorded": _with_its_record_rewritten(
        lambda d: _garbage_same_size(os.path.join(d, index.HNSW))),
    "hnsw of a smaller index, recorded": _with_its_record_rewritten(_graph_of_a_smaller_index),
    "manifest key missing": lambda d: _edit_manifest(d, lambda m: m.pop("documents")),
    "manifest key of the wrong type": lambda d: _edit_manifest(
        d, lambda m: m["model"].__setitem__("fingerprint", 123)),
    "manifest file record wrong": lambda d: _edit_manifest(
        d, lambda m: m["files"][index.VECTORS].pop("sha256")),
    "manifest a list": lambda d: _write_json(os.path.join(d, index.MANIFEST), [1, 2]),
    "vectors truncated": lambda d: _truncate(os.path.join(d, index.VECTORS)),
    "vectors with bytes appended": lambda d: _bytes_appended(os.path.join(d, index.VECTORS)),
    "vectors of another index": _vectors_of_another_index,
    "documents edited": _one_document_edited,
    "documents missing": lambda d: os.remove(os.path.join(d, index.DOCUMENTS)),
}


@pytest.mark.parametrize("damage", DAMAGE)
def test_a_damaged_index_is_refused_in_one_line(damage, built, wiki, tmp_path, capsys):
    copy = str(tmp_path / "index")
    shutil.copytree(built, copy)
    DAMAGE[damage](copy)
    code, out, err = run(["search", "--index", copy, "--queries", wiki["queries_txt"],
                          "--approximate", "--k", "3"], capsys)
    assert out == ""  # no ranking from the wrong graph or the wrong vectors
    assert_damaged(code, err)


def test_an_undamaged_copy_searches_and_a_version_1_index_is_refused(built, wiki, tmp_path,
                                                                      capsys):
    copy = str(tmp_path / "index")
    shutil.copytree(built, copy)
    code, out, err = run(["search", "--index", copy, "--queries", wiki["queries_txt"],
                          "--approximate", "--k", "3"], capsys)
    assert code == 0, err
    assert len(out.splitlines()) == 5

    def as_version_1(manifest):
        manifest["version"] = 1
        del manifest["files"], manifest["approximate"]["ntotal"]

    _edit_manifest(copy, as_version_1)
    code, out, err = run(["search", "--index", copy, "--queries", wiki["queries_txt"]], capsys)
    assert code == 2 and err.count("\n") == 1, err
    assert "index format version 1" in err and "rebuild it with" in err, err


def test_bm25_refuses_a_corpus_of_stop_words_and_answers_a_query_of_them(minilm_dir, tmp_path,
                                                                        capsys):
    stop_words = tmp_path / "stop.jsonl"
    stop_words.write_text('{"id": "a", "text": "The and of it."}\n'
                          '{"id": "b", "text": "Was it a to be?"}\n')
    queries = tmp_path / "queries.jsonl"
    queries.write_text('{"text": "it was the one", "relevant": ["a"]}\n')
    stop_index = str(tmp_path / "stop_index")
    code, _, err = run(["build", "--model", minilm_dir, "--corpus",
                        str(stop_words), "--output", stop_index], capsys)
    assert code == 0, err
    code, out, err = run(["evaluate", "--index", stop_index, "--queries", str(queries),
                          "--bm25"], capsys)
    assert code == 2 and err.startswith("bertjax: error:") and err.count("\n") == 1, err
    assert "BM25 has nothing to rank" in err and "stop word" in err, err

    ranker = Bm25(["the river bank", "an account at the bank"])
    scores, rows = ranker.search(["it was the", "river"], 2)
    assert scores[0].tolist() == [0.0, 0.0] and rows[1, 0] == 0


@pytest.fixture(scope="module")
def sense_index(tiny_models, tmp_path_factory):
    output = str(tmp_path_factory.mktemp("sense") / "index")
    wsd_cli.main(["fit", "--model", tiny_models[0], "--output", output, "--lemmas", "3"])
    return output


SENSE_DAMAGE = {
    "npz truncated": lambda d: _truncate(os.path.join(d, "sense_vectors.npz")),
    "npz garbage": lambda d: _garbage_same_size(os.path.join(d, "sense_vectors.npz")),
    "npz of another shape": lambda d: np.savez(os.path.join(d, "sense_vectors.npz"),
                                               vectors=np.zeros((2, 5), np.float32)),
    "npz without its array": lambda d: np.savez(os.path.join(d, "sense_vectors.npz"),
                                                other=np.zeros(3)),
    "json a list": lambda d: _write_json(os.path.join(d, "wsd_index.json"), []),
    "json key of the wrong type": lambda d: _edit_json(
        os.path.join(d, "wsd_index.json"), lambda i: i["senses"][0].__setitem__("examples", "7")),
    "json key missing": lambda d: _edit_json(
        os.path.join(d, "wsd_index.json"), lambda i: i["model"].pop("hidden_size")),
}


def _edit_json(path, edit):
    with open(path, encoding="utf-8") as f:
        value = json.load(f)
    edit(value)
    _write_json(path, value)


@pytest.mark.parametrize("damage", SENSE_DAMAGE)
@pytest.mark.slow
def test_a_damaged_sense_index_is_refused_in_one_line(damage, sense_index, tmp_path, capsys):
    copy = str(tmp_path / "index")
    shutil.copytree(sense_index, copy)
    SENSE_DAMAGE[damage](copy)
    code, out, err = run_cli(wsd_cli, ["predict", "--index", copy, "--sentence",
                                       "the bank of the river", "--word", "bank"], capsys)
    assert_damaged(code, err)
    assert "python -m bertjax.wsd fit" in err
