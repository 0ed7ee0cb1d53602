"""The vector index end to end on real text: Wikipedia demo sentences as queries, their paragraphs
(less the sentence) as documents (tests/retrieval_pairs.py), the real all-MiniLM-L6-v2 as the
untuned dense model, and a tiny cross-encoder fine-tuned here from scratch for re-ranking.

The CLIs run in-process; loaded models are kept for the module (`cached_models`) so each is
loaded and compiled once: what differs between commands is checked, not the loading itself.
"""

import json
import math
import os
import shutil

import jax
import numpy as np
import pytest

from bertjax.cli import main as bertjax_main
from bertjax.retrieval import approximate, exact, index, metrics
from bertjax.cli import index as cli
from bertjax.retrieval.fingerprint import fingerprint
from bertjax.retrieval.rerank import CrossEncoder
from cli_checks import run_cli
from finetune_runs import NARROW
import compile_effort
from retrieval_pairs import cross_encoder_pairs, sentence_passages, write_jsonl, write_pairs
import run_devices

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def run(argv, capsys):
    """(exit status, stdout, stderr) of `python -m bertjax.index ARGV`, in-process."""
    return run_cli(cli, argv, capsys)


def assert_refused(result, *phrases):
    code, out, err = result
    assert code == 2, err
    assert err.startswith("bertjax: error:") and err.count("\n") == 1, err
    for phrase in phrases:
        assert phrase in err, err


# --- metrics and search, by hand and by brute force ----------------------------------------------

def test_metrics_by_hand():
    ranking = ["d3", "d1", "d7", "d2"]
    assert metrics.recall_at(ranking, {"d1"}, 1) == 0.0
    assert metrics.recall_at(ranking, {"d1"}, 2) == 1.0
    assert metrics.recall_at(ranking, {"d1", "d2", "d9"}, 10) == pytest.approx(2 / 3)
    assert metrics.reciprocal_rank(ranking, {"d7", "d2"}, 10) == pytest.approx(1 / 3)
    assert metrics.reciprocal_rank(ranking, {"d2"}, 3) == 0.0
    # One relevant at rank 2: 1/log2(3); the ideal puts it at rank 1 (gain 1).
    assert metrics.ndcg_at(ranking, {"d1"}, 10) == pytest.approx(1 / math.log2(3))
    # Relevant at ranks 1 and 3 of two: (1 + 1/2) / (1 + 1/log2(3)).
    assert metrics.ndcg_at(ranking, {"d3", "d7"}, 10) == pytest.approx(
        1.5 / (1 + 1 / math.log2(3)))
    # Three relevant, k = 2: the ideal holds only two of them.
    assert metrics.ndcg_at(ranking, {"d3", "d1", "d2"}, 2) == pytest.approx(1.0)
    assert metrics.ndcg_at(ranking, {"d9"}, 10) == 0.0
    means = metrics.mean_metrics([ranking, ["d9", "d1"]], [{"d1"}, {"d9"}])
    assert means == pytest.approx({"recall@1": 0.5, "recall@10": 1.0, "mrr@10": 0.75,
                                   "ndcg@10": (1 / math.log2(3) + 1) / 2})
    assert metrics.overlap_recall([[1, 2, 3], [4, 5, 6]], [[1, 2, 9], [4, 5, 6]]) == \
        pytest.approx(5 / 6)
    with pytest.raises(ValueError):
        metrics.mean_metrics([ranking], [set()])


@pytest.mark.parametrize("count,k,chunk_rows,query_rows", [
    (1000, 7, 96, 16),     # many chunks and query batches, a last chunk part-filled
    (50, 50, 16, 64),      # k = the whole corpus, one query batch
    (37, 1, 65536, 1024),  # one chunk larger than the corpus
])
def test_exact_search_equals_numpy_brute_force(count, k, chunk_rows, query_rows):
    rng = np.random.default_rng(count)
    vectors = rng.standard_normal((count, 24)).astype(np.float32)
    vectors[count // 2] = vectors[3]  # a tie: the lower row must come first
    queries = np.concatenate([rng.standard_normal((40, 24)).astype(np.float32),
                              vectors[3:4]])
    scores, ids = exact.search(vectors, queries, k, chunk_rows=chunk_rows,
                               query_rows=query_rows)
    brute = queries.astype(np.float64) @ vectors.T.astype(np.float64)
    expected = np.argsort(-brute, axis=1, kind="stable")[:, :k]
    np.testing.assert_array_equal(ids, expected)
    np.testing.assert_allclose(scores, np.take_along_axis(brute, expected, 1), rtol=1e-5,
                               atol=1e-5)
    with pytest.raises(ValueError, match="between 1 and the corpus size"):
        exact.search(vectors, queries, count + 1)


# --- real data ------------------------------------------------------------------------------

@pytest.fixture(scope="module", autouse=True)
def cached_models():
    """Each model path is loaded (and its functions compiled) once for the module."""
    loaded = {}
    load = cli.load_model

    def cached(path, step=None, batch_size=32):
        key = (os.path.realpath(path), step, batch_size)
        if key not in loaded:
            loaded[key] = load(path, step, batch_size)
        return loaded[key]

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(cli, "load_model", cached)
        yield loaded


@pytest.fixture(scope="module")
def wiki(tmp_path_factory, demo_articles) -> dict:
    """48 passages of 6 articles (3 sentences less the query's) and their 48 sentence queries."""
    root = tmp_path_factory.mktemp("wiki")
    documents, queries = sentence_passages(demo_articles[:6], sentences=3, per_article=8)
    paths = {"docs": str(root / "docs.jsonl"), "queries_jsonl": str(root / "queries.jsonl"),
             "queries_txt": str(root / "queries.txt"), "pairs": str(root / "pairs.tsv")}
    write_jsonl(paths["docs"], documents, ("id", "text"))
    write_jsonl(paths["queries_jsonl"], queries, ("id", "text", "relevant"))
    (root / "queries.txt").write_text("".join(q["text"] + "\n" for q in queries[:5]))
    write_pairs(paths["pairs"], cross_encoder_pairs(queries, documents))
    return {**paths, "documents": documents, "queries": queries, "root": str(root)}


@pytest.fixture(scope="module")
def built(wiki, minilm_dir, tmp_path_factory) -> str:
    output = str(tmp_path_factory.mktemp("indexes") / "minilm")
    with compile_effort.compiled(optimized=True):  # MiniLM embeds every document
        cli.main(["build", "--model", minilm_dir, "--corpus", wiki["docs"], "--output", output,
                  "--approximate"])
    return output


@pytest.fixture(scope="module")
def cross_encoder_run(wiki, tmp_path_factory) -> str:
    """A 2-layer, 64-wide pair classifier trained from scratch on (query, passage, 1/0) pairs
    of the same queries (it checks the re-ranking path, not a held-out gain)."""
    from bertjax.data.tokenizer_training import train_wordpiece

    root = tmp_path_factory.mktemp("cross_encoder")
    texts = [d["text"] for d in wiki["documents"]] + [q["text"] for q in wiki["queries"]]
    train_wordpiece(texts, vocab_size=1000).save(str(root / "vocab"))
    workdir = str(root / "run")
    settings = {"model.preset": "tiny", **NARROW, "model.hidden_dropout": 0.0,
                "model.attention_dropout": 0.0, "optimizer.learning_rate": 2e-3,
                "train.batch_size": 32, "train.log_every": 10, "train.epochs": 2,
                "data.tokenizer": str(root / "vocab"), "data.train": wiki["pairs"],
                "data.eval": wiki["pairs"], "data.text_column": "query",
                "data.text_pair_column": "passage", "data.label_column": "label",
                "data.max_seq_len": 128, **run_devices.IN_A_WORKER}
    argv = ["bertjax.cli.main", f"--config={REPO}/configs/finetune_pair.py", f"--workdir={workdir}"]
    assert bertjax_main.main(argv + [f"--config.{k}={v}" for k, v in settings.items()]) == 0
    return workdir


@pytest.mark.slow
def test_the_index_holds_normalized_vectors_of_its_model(built, wiki, minilm_dir):
    opened = index.open_index(built)
    manifest = opened.manifest
    assert manifest["documents"] == len(wiki["documents"]) == opened.vectors.shape[0]
    assert [d.id for d in opened.documents] == [d["id"] for d in wiki["documents"]]
    assert opened.vectors.dtype == np.float32 and opened.vectors.shape[1] == 384
    np.testing.assert_allclose(np.linalg.norm(opened.vectors, axis=1), 1.0, atol=1e-5)
    model = cli.load_model(minilm_dir)
    assert manifest["model"]["fingerprint"] == fingerprint(model.loaded.encoder,
                                                           model.loaded.params)
    np.testing.assert_allclose(opened.vectors[:4], model.embed(
        [d["text"] for d in wiki["documents"][:4]], "mean", normalize=True), atol=1e-5)
    assert manifest["approximate"]["library"] == "faiss-cpu"
    assert manifest["approximate"]["recall_at_build"]["recall"] >= 0.9
    # A changed parameter value (the first of an array is always sampled) changes it.
    params = jax.tree.map(np.array, model.loaded.params)
    parent, key = _first_leaf(params)
    parent[key].flat[0] += 1.0
    assert fingerprint(model.loaded.encoder, params) != manifest["model"]["fingerprint"]


def _first_leaf(tree):
    while True:
        key = sorted(tree)[0]
        if not isinstance(tree[key], dict):
            return tree, key
        tree = tree[key]


@pytest.mark.slow
def test_approximate_recall_against_exact_on_minilm_vectors(built, wiki, minilm_dir):
    """The FAISS HNSW top 10 of real sentence queries against the exact top 10 over all the
    MiniLM vectors at hand (passages, and the queries' own vectors as more documents)."""
    opened = index.open_index(built)
    model = cli.load_model(minilm_dir)
    queries = model.embed([q["text"] for q in wiki["queries"]], "mean", normalize=True)
    corpus = np.concatenate([np.asarray(opened.vectors), queries[::2]])
    graph = approximate.build(corpus)
    _, approximate_ids = approximate.search(graph, queries[1::2], 10)
    _, exact_ids = exact.search(corpus, queries[1::2], 10)
    assert metrics.overlap_recall(approximate_ids, exact_ids) >= 0.9
    # And through the index: the same metric search --report-recall prints.
    _, ids = approximate.search(opened.approximate_index(), queries, 10)
    _, reference = exact.search(opened.vectors, queries, 10)
    assert metrics.overlap_recall(ids, reference) >= 0.9


@pytest.mark.slow
def test_build_refuses_bad_input_and_never_overwrites(built, wiki, minilm_dir, tmp_path, capsys):
    empty = tmp_path / "empty.jsonl"
    empty.write_text("\n")
    duplicated = tmp_path / "dup.jsonl"
    duplicated.write_text('{"id": "a", "text": "one"}\n{"id": "b", "text": "two"}\n'
                          '{"id": "a", "text": "three"}\n')
    out = str(tmp_path / "new_index")
    build = ["build", "--model", minilm_dir, "--output", out, "--corpus"]
    assert_refused(run(build + [str(empty)], capsys), "is empty")
    assert_refused(run(build + [str(duplicated)], capsys), "duplicate document id 'a'",
                   "lines 1 and 3")
    (tmp_path / "not_a_model").mkdir()
    assert_refused(run(["build", "--model", str(tmp_path / "not_a_model"), "--corpus",
                        wiki["docs"], "--output", out], capsys), "is not a model")
    assert_refused(run(build + [wiki["docs"], "--pooling", "median"], capsys),
                   "unknown pooling 'median'")
    assert not os.path.exists(out)
    before = {name: os.path.getmtime(os.path.join(built, name)) for name in os.listdir(built)}
    assert_refused(run(["build", "--model", minilm_dir, "--corpus", wiki["docs"],
                        "--output", built], capsys), "already exists", "--overwrite")
    assert {name: os.path.getmtime(os.path.join(built, name))
            for name in os.listdir(built)} == before
    assert not [n for n in os.listdir(os.path.dirname(built)) if n.startswith(".")]


@pytest.mark.slow
def test_search_refuses_bad_input(built, wiki, cross_encoder_run, tmp_path, capsys):
    empty = tmp_path / "q.txt"
    empty.write_text("  \n\n")
    search = ["search", "--index", built, "--queries"]
    assert_refused(run(search + [str(empty)], capsys), "is empty")
    assert_refused(run(search + [wiki["queries_txt"], "--model", cross_encoder_run], capsys),
                   "an index built by another model")
    assert_refused(run(search + [wiki["queries_txt"], "--k", "0"], capsys), "--k must be")
    assert_refused(run(search + [wiki["queries_txt"], "--k", "10", "--rerank",
                                 cross_encoder_run, "--rerank-k", "5"], capsys),
                   "--rerank-k (5) must be at least --k (10)")
    assert_refused(run(search + [wiki["queries_txt"], "--rerank", wiki["root"]], capsys),
                   "is not a model")
    existing = tmp_path / "results.jsonl"
    existing.write_text("keep me\n")
    assert_refused(run(search + [wiki["queries_txt"], "--output", str(existing)], capsys),
                   "already exists")
    assert existing.read_text() == "keep me\n"
    assert_refused(run(["search", "--index", wiki["root"], "--queries", wiki["queries_txt"]],
                       capsys), "is not a bertjax index")
    assert_refused(run(["evaluate", "--index", built, "--queries", wiki["queries_txt"]], capsys),
                   "needs a .jsonl query file")
    # A copy whose manifest names another fingerprint, and no approximate index.
    copy = str(tmp_path / "copy")
    shutil.copytree(built, copy)
    with open(os.path.join(copy, "manifest.json")) as f:
        manifest = json.load(f)
    manifest["model"]["fingerprint"] = "0" * 32
    manifest["approximate"] = None
    with open(os.path.join(copy, "manifest.json"), "w") as f:
        json.dump(manifest, f)
    assert_refused(run(["search", "--index", copy, "--queries", wiki["queries_txt"]], capsys),
                   "has changed since", "rebuild the index")
    assert_refused(run(["search", "--index", copy, "--queries", wiki["queries_txt"],
                        "--approximate"], capsys), "has no approximate index")
    unknown = tmp_path / "unknown.jsonl"
    unknown.write_text('{"text": "a query", "relevant": ["nope"]}\n')
    assert_refused(run(["evaluate", "--index", built, "--queries", str(unknown)], capsys),
                   "not in", "'nope'")


@pytest.mark.slow
def test_k_larger_than_the_corpus_returns_it_all_with_a_warning(built, wiki, capsys):
    code, out, err = run(["search", "--index", built, "--queries", wiki["queries_txt"],
                          "--k", "500"], capsys)
    assert code == 0, err
    assert "warning: --k 500 is more than the 48 documents in the index; returning 48" in err
    rankings = [json.loads(line) for line in out.splitlines()]
    assert len(rankings) == 5
    assert all(sorted(h["id"] for h in r["results"]) == sorted(d["id"] for d in wiki["documents"])
               for r in rankings)


@pytest.mark.optimized
@pytest.mark.slow
def test_search_rerank_and_evaluate_end_to_end(built, wiki, cross_encoder_run, minilm_dir,
                                               tmp_path, capsys):
    """Exact and approximate search to files, re-ranking by the cross-encoder, and the metrics
    table of all four methods."""
    results = {}
    for method in ("exact", "approximate"):
        path = str(tmp_path / f"{method}.jsonl")
        code, _, err = run(["search", "--index", built, "--queries", wiki["queries_jsonl"],
                            "--k", "10", f"--{method}", "--output", path, "--report-recall"],
                           capsys)
        assert code == 0, err
        assert "approximate vs exact top 10: recall" in err
        with open(path) as f:
            results[method] = [json.loads(line) for line in f]
    assert [r["id"] for r in results["exact"]] == [q["id"] for q in wiki["queries"]]
    exact_hits = [[h["id"] for h in r["results"]] for r in results["exact"]]
    approximate_hits = [[h["id"] for h in r["results"]] for r in results["approximate"]]
    assert metrics.overlap_recall(approximate_hits, exact_hits) >= 0.9
    relevant = [set(q["relevant"]) for q in wiki["queries"]]
    dense = metrics.mean_metrics(exact_hits, relevant)
    # Untuned MiniLM finds a sentence's own paragraph among 48 far more often than chance.
    assert dense["recall@1"] > 0.4 and dense["mrr@10"] > 0.5, dense

    reranked_path = str(tmp_path / "reranked.jsonl")
    code, _, err = run(["search", "--index", built, "--queries", wiki["queries_jsonl"], "--k", "5",
                        "--rerank", cross_encoder_run, "--rerank-k", "8",
                        "--output", reranked_path], capsys)
    assert code == 0, err
    with open(reranked_path) as f:
        reranked = [json.loads(line) for line in f]
    # The re-ranked top 5 are the cross-encoder's best of the dense top 8, with the scores its
    # own predict gives (compared by value: a barely trained model has near-ties).
    scorer = CrossEncoder(cli.load_model(cross_encoder_run))
    texts = {d["id"]: d["text"] for d in wiki["documents"]}
    dense_8 = [json.loads(line) for line in run(
        ["search", "--index", built, "--queries", wiki["queries_jsonl"], "--k", "8"], capsys)[1]
        .splitlines()]
    for query, first, second in zip(wiki["queries"][:6], dense_8, reranked):
        candidates = [h["id"] for h in first["results"]]
        scores = dict(zip(candidates, scorer.score([query["text"]] * 8,
                                                   [texts[c] for c in candidates])))
        kept = [h["id"] for h in second["results"]]
        assert len(kept) == 5 and set(kept) <= set(candidates)
        got = [h["score"] for h in second["results"]]
        assert got == sorted(got, reverse=True)
        np.testing.assert_allclose(got, [scores[i] for i in kept], atol=1e-5)
        assert max(scores[c] for c in candidates if c not in kept) <= min(got) + 1e-5
        dense_score = {h["id"]: h["score"] for h in first["results"]}
        assert [h["dense_score"] for h in second["results"]] == pytest.approx(
            [dense_score[i] for i in kept], abs=1e-5)

    code, out, err = run(["evaluate", "--index", built, "--queries", wiki["queries_jsonl"],
                          "--bm25", "--rerank", cross_encoder_run, "--rerank-k", "20"], capsys)
    assert code == 0, err
    rows = {line.split("|")[1].strip(): [float(x) for x in line.split("|")[2:6]]
            for line in out.splitlines() if line.startswith("| ") and "method" not in line}
    assert set(rows) == {"dense exact", "dense approximate", "BM25", "dense exact + rerank@20"}
    assert rows["dense exact"] == pytest.approx([round(dense[c], 3) for c in (
        "recall@1", "recall@10", "mrr@10", "ndcg@10")], abs=1e-3)
    assert all(0.0 <= value <= 1.0 for values in rows.values() for value in values)
    # BM25 finds most of these paragraphs (they share the article's words).
    assert rows["BM25"][1] > 0.5
    assert "approximate vs exact top 10: recall" in out
