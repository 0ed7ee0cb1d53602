"""The optional dependencies (setup.cfg's extras): the core requirements name none of them, `all` is
their union, `import bertjax` and the core commands import none, and each command that needs a
missing one stops with one stderr line, exit status 2, naming the `pip install` to run.

Each command runs in this process with the extra's module made unimportable (None in sys.modules);
one runs in a process of its own, as a user starts it."""

import ast
import configparser
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from bertjax.cli import bench as bench_cli
from bertjax.cli import compile as compile_cli
from bertjax.cli import convert as convert_cli
from bertjax.cli import index as index_cli
from bertjax.cli import prepare as prepare_cli
from bertjax.core import debian_archive, packaged
from bertjax.data import books_corpus
from bertjax.retrieval import index as retrieval_index
from bertjax.retrieval import integrity

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Each extra of setup.cfg: the modules bertjax imports from it.
EXTRAS = {"retrieval": ("faiss", "bm25s", "Stemmer"), "books": ("rdata",),
          "tfds": ("tensorflow_datasets", "array_record"), "gcs": ("gcsfs",), "tpu": ("libtpu",),
          "hf": ("torch", "transformers"), "beam": ("apache_beam",),
          "gpu-compile": ("jax_plugins",)}
PRODUCT_EXTRAS = tuple(EXTRAS)
# gpu-compile: hundreds of MB; beam: caps protobuf below what transformers needs (setup.cfg).
# make test-all installs both beside `all`.
NOT_IN_ALL = ("gpu-compile", "beam")
TEST_EXTRAS = ("test", "test-all")
FORBIDDEN_IN_CORE = ("grain", "faiss", "faiss-cpu", "bm25s", "pystemmer", "rdata", "torch",
                     "libtpu")
OPTIONAL_MODULES = sorted({m for modules in EXTRAS.values() for m in modules} |
                          {"tensorflow", "sklearn", "google.auth", "google.cloud"})


def _setup_cfg() -> configparser.ConfigParser:
    config = configparser.ConfigParser()
    config.read(os.path.join(REPO, "setup.cfg"))
    return config


def _requirements(text: str) -> list[str]:
    return [line.strip() for line in text.strip().splitlines()
            if line.strip() and not line.strip().startswith("#")]


def _name(requirement: str) -> str:
    for i, char in enumerate(requirement):
        if not (char.isalnum() or char in "-_."):
            return requirement[:i].lower().replace("_", "-")
    return requirement.lower().replace("_", "-")


def test_core_requirements_name_no_extra_and_all_is_the_union_of_the_product_extras():
    config = _setup_cfg()
    core = {_name(r) for r in _requirements(config["options"]["install_requires"])}
    assert not core & set(FORBIDDEN_IN_CORE), core & set(FORBIDDEN_IN_CORE)
    extras = {name: _requirements(value)
              for name, value in config["options.extras_require"].items()}
    assert set(extras) == {*PRODUCT_EXTRAS, "all", *TEST_EXTRAS}, sorted(extras)
    union = {r for name in PRODUCT_EXTRAS if name not in NOT_IN_ALL for r in extras[name]}
    assert sorted(extras["all"]) == sorted(union)
    for name in ("zstandard", "cmeel-mimalloc", "filelock"):  # test machinery's, gone
        assert all(_name(r) != name for rs in extras.values() for r in rs), name
    # No product requirement in the test tools' extras: those come with the product's extras.
    product = {_name(r) for name in PRODUCT_EXTRAS for r in extras[name]} | core
    assert not {_name(r) for name in TEST_EXTRAS for r in extras[name]} & product


def run_cli(module, argv, capsys):
    """(exit status, stdout, stderr) of a command's main(), which exits or returns its status."""
    capsys.readouterr()
    try:
        code = module.main(argv) or 0
    except SystemExit as e:
        code = e.code
    out, err = capsys.readouterr()
    return code, out, err


def test_an_extra_is_imported_only_through_extras_require():
    """No import statement names an extra's module: each goes through bertjax.core.extras, the
    one place that turns its absence into the one-line refusal."""
    optional = {m for modules in EXTRAS.values() for m in modules}
    found = []
    for directory, _, files in os.walk(os.path.join(REPO, "bertjax")):
        for file in (f for f in files if f.endswith(".py")):
            path = os.path.join(directory, file)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                names = ([a.name for a in node.names] if isinstance(node, ast.Import) else
                         [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
                found += [f"{os.path.relpath(path, REPO)}:{node.lineno}: {name}"
                          for name in names if name.split(".")[0] in optional]
    assert not found, found


def _refused(code, err, extra):
    assert code == 2, err
    lines = err.strip("\n").split("\n")
    assert len(lines) == 1 and lines[0].startswith("bertjax: error:"), err
    assert f"needs the {extra} extra" in err and f"pip install 'bertjax[{extra}]'" in err, err


def _block(monkeypatch, *modules):
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)  # makes `import module` fail


def _index(path, *, approximate: bool) -> str:
    """A two-document index written by hand (its model is never loaded by a refused command)."""
    os.makedirs(path)
    np.save(os.path.join(path, retrieval_index.VECTORS), np.eye(2, 4, dtype=np.float32))
    with open(os.path.join(path, retrieval_index.DOCUMENTS), "w", encoding="utf-8") as f:
        f.writelines(json.dumps({"id": f"d{i}", "text": f"document number {i}"}) + "\n"
                     for i in range(2))
    files = [retrieval_index.VECTORS, retrieval_index.DOCUMENTS]
    if approximate:
        with open(os.path.join(path, retrieval_index.HNSW), "wb") as f:
            f.write(b"a graph FAISS would read")
        files.append(retrieval_index.HNSW)
    manifest = {
        "format": retrieval_index.FORMAT, "version": retrieval_index.VERSION,
        "model": {"path": os.path.join(path, "no-model"), "kind": "bertjax", "step": None,
                  "encoder": {}, "fingerprint": "0"},
        "pooling": "mean", "max_seq_len": 32, "corpus": "corpus.jsonl", "documents": 2,
        "dim": 4, "standardizer": None, "truncated": 0,
        "approximate": ({"library": "faiss-cpu", "kind": "HNSWFlat", "ntotal": 2,
                         "recall_at_build": {"queries": 2, "k": 1, "recall": 1.0}}
                        if approximate else None),
        "files": {name: integrity.file_record(os.path.join(path, name)) for name in files}}
    with open(os.path.join(path, retrieval_index.MANIFEST), "w", encoding="utf-8") as f:
        json.dump(manifest, f)
    return str(path)


@pytest.fixture
def queries(tmp_path) -> str:
    path = tmp_path / "queries.jsonl"
    path.write_text(json.dumps({"id": "q", "text": "number", "relevant": ["d1"]}) + "\n")
    return str(path)


def test_retrieval_extra(monkeypatch, capsys, tmp_path, queries):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "d", "text": "a document"}) + "\n")
    _block(monkeypatch, "faiss")
    # Refused before the model (which does not exist here) is loaded or the corpus embedded.
    code, _, err = run_cli(index_cli, ["build", "--model", str(tmp_path / "model"), "--corpus",
                                       str(corpus), "--output", str(tmp_path / "built"),
                                       "--approximate"], capsys)
    _refused(code, err, "retrieval")
    assert "FAISS" in err and not os.path.exists(tmp_path / "built")
    with_graph = _index(tmp_path / "with-graph", approximate=True)
    for command in (["search", "--index", with_graph, "--queries", queries, "--approximate"],
                    ["evaluate", "--index", with_graph, "--queries", queries]):
        _refused(*run_cli(index_cli, command, capsys)[::2], "retrieval")
    plain = _index(tmp_path / "plain", approximate=False)
    for module in ("bm25s", "Stemmer"):
        monkeypatch.undo()
        _block(monkeypatch, module)
        code, _, err = run_cli(index_cli, ["evaluate", "--index", plain, "--queries", queries,
                                           "--bm25"], capsys)
        _refused(code, err, "retrieval")
        assert f"BM25 baseline (--bm25) needs the retrieval extra ({module} is not installed)" \
            in err, err


def test_books_extra_is_refused_before_anything_is_fetched(monkeypatch, capsys, tmp_path):
    _block(monkeypatch, "rdata")

    def fetched(*args, **kwargs):
        raise AssertionError("fetched a package before refusing")

    monkeypatch.setattr(debian_archive, "fetch", fetched)
    monkeypatch.setattr(packaged, "fetch", fetched)
    monkeypatch.setattr(books_corpus, "demo_corpus_path", fetched)
    code, _, err = run_cli(books_corpus, ["--output", str(tmp_path / "books+wiki.txt")], capsys)
    _refused(code, err, "books")
    assert not os.path.exists(tmp_path / "books+wiki.txt")


@pytest.mark.tfds  # each module blocked while the other is installed
@pytest.mark.parametrize("module", EXTRAS["tfds"])
def test_tfds_extra(module, monkeypatch, capsys, tmp_path):
    _block(monkeypatch, module)
    code, _, err = run_cli(prepare_cli, ["--input", "tfds:wikipedia/20230601.en", "--format",
                                         "sentences", "--output", str(tmp_path / "prepared"),
                                         "--train-vocab", "wordpiece", "--vocab-size", "100"],
                           capsys)
    _refused(code, err, "tfds")
    assert "reading tfds:wikipedia/20230601.en" in err and f"{module} is not installed" in err


def test_gcs_extra(monkeypatch, capsys, queries):
    _block(monkeypatch, "gcsfs")
    code, _, err = run_cli(index_cli, ["search", "--index", "gs://bucket/index", "--queries",
                                       queries], capsys)
    _refused(code, err, "gcs")
    assert "gs://bucket/index" in err


def test_tpu_extra(monkeypatch, capsys):
    _block(monkeypatch, "libtpu")
    code, _, err = run_cli(compile_cli, ["bertjax.compile", f"--config={REPO}/configs/tiny.py",
                                         "--topology=v5e-8"], capsys)
    _refused(code, err, "tpu")


def test_gpu_compile_extra(monkeypatch, capsys):
    _block(monkeypatch, "jax_plugins")
    code, _, err = run_cli(compile_cli, ["bertjax.compile", f"--config={REPO}/configs/tiny.py",
                                         "--topology=h100-8"], capsys)
    _refused(code, err, "gpu-compile")
    assert err.startswith("bertjax: error: compiling for a GPU node needs the gpu-compile extra")


def test_hf_extra_for_the_torch_peer(monkeypatch, capsys):
    _block(monkeypatch, "torch")  # what it imports first (transformers would import torch)
    code, _, err = run_cli(bench_cli, ["bertjax.bench", f"--config={REPO}/configs/tiny.py",
                                       "--compare-torch"], capsys)
    _refused(code, err, "hf")
    assert err.startswith("bertjax: error: --compare-torch needs the hf extra"), err


def test_hf_extra_for_pytorch_weights(monkeypatch, capsys, tmp_path):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (tmp_path / "hf" / "pytorch_model.bin").write_bytes(b"not read")
    _block(monkeypatch, "torch")
    code, _, err = run_cli(convert_cli, ["--from-hf", str(tmp_path / "hf"), "--output",
                                         str(tmp_path / "out")], capsys)
    _refused(code, err, "hf")
    assert "pytorch_model.bin" in err and not os.path.exists(tmp_path / "out")


# Run in a fresh interpreter with every optional module unimportable: every command module
# imports, and one command, started as a user starts it, refuses in one line.
_CHILD = f"""
import importlib, pkgutil, sys
for name in {OPTIONAL_MODULES!r}:
    sys.modules[name] = None
import bertjax, bertjax.cli
for info in pkgutil.iter_modules(bertjax.cli.__path__):
    importlib.import_module("bertjax.cli." + info.name)
from bertjax.cli.index import main
main(sys.argv[1:])
"""


def test_a_fresh_process_without_any_extra(tmp_path):
    corpus = tmp_path / "corpus.jsonl"
    corpus.write_text(json.dumps({"id": "d", "text": "a document"}) + "\n")
    result = subprocess.run(
        [sys.executable, "-c", _CHILD, "build", "--model", str(tmp_path / "model"), "--corpus",
         str(corpus), "--output", str(tmp_path / "built"), "--approximate"],
        cwd=REPO, capture_output=True, text=True, timeout=120)
    _refused(result.returncode, result.stderr, "retrieval")
