"""Standardisation of embeddings (z-scoring, all-but-the-top) and the anisotropy evaluation: the
statistics on synthetic data, then end to end with the real all-MiniLM-L6-v2 through the
commands (embed, index, wsd, evaluate anisotropy) and the Python API."""

import dataclasses
import json
import os

import numpy as np
import pytest

from bertjax.cli import embed as embed_cli
from bertjax.cli import evaluate as evaluate_cli
from bertjax.cli import index as index_cli
from bertjax.cli import model_options
from bertjax.core.errors import UserError
from bertjax.inference import api
from bertjax.vectors import anisotropy, standardizer
from bertjax.wsd import wordnet
from bertjax.wsd.index import SenseIndex
from cli_checks import assert_one_line_error, run_cli, snapshot

# --- the statistics, on known distributions ------------------------------------------------


def test_statistics_of_a_known_distribution_are_recovered():
    rng = np.random.default_rng(0)
    mean, spread = rng.normal(0, 3, 16), rng.uniform(0.5, 4, 16)
    data = mean + spread * rng.standard_normal((40_000, 16))
    fitted = standardizer.fit(np.array_split(data, 7), standardizer.ZSCORE, {"vectors": "test"})
    np.testing.assert_allclose(fitted.mean, mean, atol=0.05)
    np.testing.assert_allclose(fitted.scale, spread, rtol=0.02)
    assert fitted.about["count"] == 40_000 and fitted.about["constant_dimensions"] == 0
    out = fitted.apply(data)
    np.testing.assert_allclose(out.mean(axis=0), 0, atol=1e-6)
    np.testing.assert_allclose(out.std(axis=0), 1, atol=1e-5)
    # All-but-the-top finds a planted dominant direction and removes it with the mean.
    direction = rng.standard_normal(16)
    direction /= np.linalg.norm(direction)
    spike = 10 * rng.standard_normal((20_000, 1)) * direction
    skewed = 5 + rng.standard_normal((20_000, 16)) + spike
    top = standardizer.fit([skewed], standardizer.ALL_BUT_THE_TOP, {}, components=1)
    assert abs(top.components[0] @ direction) > 0.999
    cleaned = top.apply(skewed)
    np.testing.assert_allclose(cleaned.mean(axis=0), 0, atol=1e-4)
    assert np.abs(cleaned @ top.components[0]).max() < 1e-4
    assert np.var(skewed @ direction) > 90 and np.var(cleaned @ direction) < 0.01
    assert standardizer.default_components(384) == 4
    # A constant dimension is left unscaled (and counted) rather than divided by zero.
    flat = np.concatenate([data[:100, :3], np.ones((100, 1))], axis=1)
    assert standardizer.fit([flat], standardizer.ZSCORE, {}).about["constant_dimensions"] == 1


def test_measures_of_known_geometry():
    rng = np.random.default_rng(1)
    sentences = np.repeat(np.arange(200), 10)
    words = np.tile(np.arange(10), 200)
    isotropic = rng.standard_normal((2000, 64))
    g = anisotropy.measure(isotropic, sentences, words)
    assert abs(g.baseline) < 0.02 and abs(g.self_similarity) < 0.05 and g.words == 10
    assert 1 / 64 < g.top1_variance < 2 / 64
    # A shared direction: every cosine near 1; one word's vector fixed across contexts.
    shifted = isotropic + 20.0
    assert anisotropy.measure(shifted, sentences, words).baseline > 0.99
    fixed = isotropic.copy()
    fixed[words == 3] = rng.standard_normal(64)
    assert anisotropy.self_similarity(fixed, sentences, np.where(words == 3, 3, -1),
                                      np.random.default_rng(0)) == (pytest.approx(1.0), 1)
    assert np.isnan(anisotropy.measure(isotropic[:5], np.zeros(5, int), -np.ones(5, int))
                    .baseline)


def test_saved_statistics_round_trip_and_a_damaged_file_is_one_line(tmp_path):
    fitted = standardizer.fit([np.random.default_rng(2).normal(size=(50, 8))],
                              standardizer.ALL_BUT_THE_TOP, {"vectors": "sentences"},
                              components=2)
    path = str(tmp_path / "stats.npz")
    standardizer.save(fitted, path)
    loaded = standardizer.load(path)
    assert loaded.digest == fitted.digest and loaded.about == fitted.about
    with pytest.raises(UserError, match="already exists"):
        standardizer.save(fitted, path)
    data = open(path, "rb").read()
    damaged = {"truncated": data[:len(data) // 2], "garbage": b"not a zip file",
               "empty": b""}
    for name, content in damaged.items():
        bad = tmp_path / f"{name}.npz"
        bad.write_bytes(content)
        with pytest.raises(UserError, match="not a readable statistics file"):
            standardizer.load(str(bad))
    np.savez(tmp_path / "other.npz", mean=np.zeros(3))
    with pytest.raises(UserError, match="not a bertjax statistics file"):
        standardizer.load(str(tmp_path / "other.npz"))
    with pytest.raises(UserError, match="not found"):
        standardizer.load(str(tmp_path / "missing.npz"))
    with pytest.raises(UserError, match="between 1 and 7"):
        standardizer.fit([np.ones((5, 8))], standardizer.ALL_BUT_THE_TOP, {}, components=8)
    with pytest.raises(UserError, match="at least 2"):
        standardizer.fit([np.ones((1, 8))], standardizer.ZSCORE, {})
    with pytest.raises(UserError, match="non-finite"):
        standardizer.fit([np.full((3, 8), np.nan)], standardizer.ZSCORE, {})


# --- end to end with a real model ------------------------------------------------------------


@pytest.fixture(scope="module")
def minilm(minilm_dir):
    return api.load(minilm_dir, batch_size=16, max_seq_len=64)


@pytest.fixture(scope="module", autouse=True)
def one_model_load(minilm, minilm_dir):
    """The commands load MiniLM once for the module (and compile its functions once)."""
    original_cli, original_index = model_options.load_model, index_cli.load_model
    model_options.load_model = lambda args: minilm
    index_cli.load_model = lambda path, step=None, batch_size=32: (
        minilm if os.path.samefile(path, minilm_dir) else original_index(path, step, batch_size))
    yield
    model_options.load_model, index_cli.load_model = original_cli, original_index


@pytest.fixture(scope="module")
def corpora(tmp_path_factory, demo_articles) -> dict:
    root = tmp_path_factory.mktemp("corpora")
    sentences = [s for article in demo_articles[:12] for s in article if len(s.split()) > 3]
    paths = {"reference": root / "reference.txt", "other": root / "other.txt",
             "docs": root / "docs.jsonl", "queries": root / "queries.txt",
             "empty": root / "empty.txt"}
    paths["reference"].write_text("\n".join(sentences[:48]) + "\n", encoding="utf-8")
    paths["other"].write_text("\n".join(sentences[48:64]) + "\n", encoding="utf-8")
    paths["docs"].write_text("".join(json.dumps({"id": f"d{i}", "text": s}) + "\n"
                                     for i, s in enumerate(sentences[64:88])), encoding="utf-8")
    paths["queries"].write_text("\n".join(s[:40] for s in sentences[64:70]) + "\n",
                                encoding="utf-8")
    paths["empty"].write_text("\n \n", encoding="utf-8")
    return {key: str(value) for key, value in paths.items()}


@pytest.fixture(scope="module")
def stats(tmp_path_factory, minilm_dir, corpora) -> dict:
    root = tmp_path_factory.mktemp("stats")
    paths = {"zscore": str(root / "z.npz"), "abtt": str(root / "abtt.npz"),
             "words": str(root / "words.npz")}
    embed_cli.main(["--model", minilm_dir, "--fit-standardizer", corpora["reference"],
                    "--output", paths["zscore"], "--pooling", "mean"])
    embed_cli.main(["--model", minilm_dir, "--fit-standardizer", corpora["reference"],
                    "--output", paths["abtt"], "--pooling", "mean", "--method",
                    "all-but-the-top"])
    embed_cli.main(["--model", minilm_dir, "--fit-standardizer", corpora["reference"],
                    "--output", paths["words"], "--word-vectors", "--layers", "-1"])
    return paths


@pytest.mark.optimized
@pytest.mark.slow
def test_standardised_embeddings_have_zero_mean_and_unit_variance_on_the_reference(
        stats, corpora, minilm, minilm_dir, tmp_path, capsys):
    fitted = standardizer.load(stats["zscore"])
    assert fitted.about["count"] == 48 and fitted.about["vectors"] == "sentences"
    assert fitted.about["layers"] == list(range(7)) and fitted.about["pooling"] == "mean"
    output = str(tmp_path / "vectors.npy")
    code, out, err = run_cli(embed_cli, ["--model", minilm_dir, "--input", corpora["reference"],
                                         "--output", output, "--pooling", "mean",
                                         "--standardize", stats["zscore"]], capsys)
    assert code == 0, err
    vectors = np.load(output)
    np.testing.assert_allclose(vectors.mean(axis=0), 0, atol=1e-4)
    # Every dimension has unit variance but those constant on the corpus (MiniLM's mean-pooled
    # vectors have a few), which stay at ~0.
    spread = vectors.std(axis=0)
    assert np.sum(np.abs(spread - 1) < 1e-3) == 384 - fitted.about["constant_dimensions"]
    assert np.all((np.abs(spread - 1) < 1e-3) | (spread < 1e-6))
    # The same through the API, and normalised afterwards; word vectors with their statistics.
    raw = minilm.embed(open(corpora["other"]).read().splitlines(), "mean")
    unit = minilm.embed(open(corpora["other"]).read().splitlines(), "mean", normalize=True,
                        standardize=stats["zscore"])
    expected = (raw - fitted.mean) / fitted.scale
    np.testing.assert_allclose(unit, expected / np.linalg.norm(expected, axis=1, keepdims=True),
                               atol=1e-5)
    words = standardizer.load(stats["words"])
    standardised = minilm.word_vectors([["the", "bank", "of", "the", "river"]], -1,
                                       standardize=words)[0]
    plain = minilm.word_vectors([["the", "bank", "of", "the", "river"]], -1)[0]
    np.testing.assert_allclose(standardised, words.apply(plain), atol=1e-5)
    abtt = standardizer.load(stats["abtt"])
    assert abtt.method == "all-but-the-top" and abtt.components.shape == (4, 384)


@pytest.mark.slow
def test_statistics_of_another_model_pooling_or_layers_are_refused(stats, corpora, minilm,
                                                                   minilm_dir, tmp_path, capsys):
    texts = ["a sentence", "another one"]
    with pytest.raises(UserError, match="of mean pooling, not cls"):
        minilm.embed(texts, "cls", standardize=stats["zscore"])
    with pytest.raises(UserError, match="layers"):
        minilm.embed(texts, "mean", layers=-1, standardize=stats["zscore"])
    with pytest.raises(UserError, match="of words vectors, not sentences"):
        minilm.embed(texts, "mean", standardize=stats["words"])
    with pytest.raises(UserError, match="of sentences vectors, not words"):
        minilm.word_vectors([["a", "word"]], -1, standardize=stats["zscore"])
    with pytest.raises(TypeError, match="standardize"):
        minilm.embed(texts, "mean", standardize=3)
    fitted = standardizer.load(stats["zscore"])
    foreign = dataclasses.replace(fitted, about={**fitted.about, "model": {
        "path": "/elsewhere/model", "fingerprint": "0" * 32}})
    standardizer.save(foreign, str(tmp_path / "foreign.npz"))
    before = snapshot(str(tmp_path))
    cases = {
        "another model": (["--input", corpora["other"], "--output", str(tmp_path / "v.npy"),
                           "--pooling", "mean", "--standardize", str(tmp_path / "foreign.npz")],
                          "another model (/elsewhere/model)"),
        "another layer set": (["--input", corpora["other"], "--output", str(tmp_path / "v.npy"),
                               "--pooling", "mean", "--layers", "-1", "--standardize",
                               stats["zscore"]], "of layers [0, 1, 2, 3, 4, 5, 6], not [6]"),
        "empty corpus": (["--fit-standardizer", corpora["empty"], "--output",
                          str(tmp_path / "s.npz"), "--pooling", "mean"], "has no text"),
        "damaged statistics": (["--input", corpora["other"], "--output",
                                str(tmp_path / "v.npy"), "--pooling", "mean", "--standardize",
                                corpora["other"]], "not a readable statistics file"),
        "not npz": (["--fit-standardizer", corpora["reference"], "--output",
                     str(tmp_path / "s.npy"), "--pooling", "mean"], "give --output a .npz"),
        "no pooling": (["--fit-standardizer", corpora["reference"], "--output",
                        str(tmp_path / "s.npz")], "needs --pooling"),
        "existing": (["--fit-standardizer", corpora["reference"], "--output",
                      str(tmp_path / "foreign.npz"), "--pooling", "mean"], "already exists"),
        "components of z-scores": (["--fit-standardizer", corpora["reference"], "--output",
                                    str(tmp_path / "s.npz"), "--pooling", "mean",
                                    "--components", "3"], "--method all-but-the-top"),
        "method without fitting": (["--input", corpora["other"], "--output",
                                    str(tmp_path / "v.npy"), "--pooling", "mean", "--method",
                                    "zscore"], "go with --fit-standardizer"),
    }
    for argv, phrase in cases.values():
        code, _, err = run_cli(embed_cli, ["--model", minilm_dir, *argv], capsys)
        assert_one_line_error(code, err, phrase)
    assert snapshot(str(tmp_path)) == before


@pytest.mark.slow
def test_an_index_built_with_statistics_refuses_a_search_without_them(
        stats, corpora, minilm, minilm_dir, tmp_path, capsys):
    built, plain = str(tmp_path / "standardised"), str(tmp_path / "plain")
    for output, extra in ((built, ["--standardize", stats["zscore"]]), (plain, [])):
        code, _, err = run_cli(index_cli, ["build", "--model", minilm_dir, "--corpus",
                                           corpora["docs"], "--output", output, *extra], capsys)
        assert code == 0, err
    manifest = json.load(open(os.path.join(built, "manifest.json")))
    fitted = standardizer.load(stats["zscore"])
    assert manifest["standardizer"]["digest"] == fitted.digest
    assert manifest["standardizer"]["method"] == "zscore"
    assert json.load(open(os.path.join(plain, "manifest.json")))["standardizer"] is None
    texts = [json.loads(line)["text"] for line in open(corpora["docs"])]
    stored = np.load(os.path.join(built, "vectors.npy"))
    np.testing.assert_allclose(stored, minilm.embed(texts, "mean", normalize=True,
                                                    standardize=fitted), atol=1e-5)
    search = ["search", "--index", built, "--queries", corpora["queries"], "--k", "3"]
    code, out, err = run_cli(index_cli, [*search, "--standardize", stats["zscore"]], capsys)
    assert code == 0, err
    assert len(out.splitlines()) == 6
    refusals = [(search, "was built with zscore statistics"),
                ([*search, "--standardize", stats["abtt"]], "not the ones"),
                (["search", "--index", plain, "--queries", corpora["queries"], "--standardize",
                  stats["zscore"]], "built without standardisation"),
                (["build", "--model", minilm_dir, "--corpus", corpora["docs"], "--output",
                  str(tmp_path / "words"), "--standardize", stats["words"]], "words vectors")]
    for argv, phrase in refusals:
        code, _, err = run_cli(index_cli, argv, capsys)
        assert_one_line_error(code, err, phrase)
    assert not os.path.exists(tmp_path / "words")


@pytest.mark.slow
def test_a_sense_index_fitted_with_statistics_needs_them(stats, minilm, tmp_path):
    examples = [e for e in wordnet.read_examples() if e.lemma in ("bank", "plant")][:20]
    words = standardizer.load(stats["words"])
    index = SenseIndex.fit(minilm, examples, -1, words)
    index.save(str(tmp_path / "senses"))
    info = json.load(open(tmp_path / "senses" / "wsd_index.json"))
    assert info["standardizer"]["digest"] == words.digest
    with pytest.raises(UserError, match="pass the same statistics file with --standardize"):
        SenseIndex.load(str(tmp_path / "senses"), minilm)
    reloaded = SenseIndex.load(str(tmp_path / "senses"), minilm, words)
    e = examples[0]
    assert reloaded.rank(e.words, e.index) == index.rank(e.words, e.index)
    with pytest.raises(UserError, match="not the ones"):
        SenseIndex.load(str(tmp_path / "senses"), minilm, standardizer.load(stats["abtt"]))


@pytest.mark.slow
def test_the_anisotropy_evaluation_prints_draws_and_records_each_layer(
        corpora, minilm_dir, tmp_path, capsys):
    plot, record = str(tmp_path / "anisotropy.png"), str(tmp_path / "anisotropy.json")
    code, out, err = run_cli(evaluate_cli, ["anisotropy", "--model", minilm_dir, "--corpus",
                                            corpora["reference"], "--plot", plot, "--json",
                                            record], capsys)
    assert code == 0, err
    assert open(plot, "rb").read(8) == b"\x89PNG\r\n\x1a\n"
    figures = json.load(open(record))
    assert figures["sentences"] == 48 and set(figures["layers"]) == {
        "raw", "zscore", "all-but-the-top"}
    raw, zscored = figures["layers"]["raw"], figures["layers"]["zscore"]
    assert len(raw) == 7 and len(out.splitlines()) == 3 + 3 * 7  # header, table, "wrote"
    # Contextual layers are anisotropic; z-scoring removes the shared direction and evens the
    # dimensions out (each then holds 1/H of the variance).
    assert all(layer["baseline"] > 0.05 for layer in raw[1:])
    assert all(abs(layer["baseline"]) < 0.05 for layer in zscored)
    assert all(layer["top1_variance"] == pytest.approx(1 / 384, rel=0.05) for layer in zscored)
    assert all(0 < layer["self_similarity"] <= 1 and layer["words"] > 10 for layer in raw)
    code, _, err = run_cli(evaluate_cli, ["anisotropy", "--model", minilm_dir, "--corpus",
                                          corpora["empty"]], capsys)
    assert_one_line_error(code, err, "has no text")
    code, _, err = run_cli(evaluate_cli, ["anisotropy", "--model", minilm_dir, "--corpus",
                                          corpora["reference"], "--plot", plot], capsys)
    assert_one_line_error(code, err, "already exists")
