"""Sentence embeddings and similarity: the real all-MiniLM-L6-v2 against transformers, the embed
CLI, and document similarity against the Lee et al. (2005) human ratings.

transformers' BertModel with `output_hidden_states=True` is the oracle: its tokenizer and forward
pass, then sentence-transformers' mean pooling (attention-mask weighted, [CLS] and [SEP] included)
and L2 normalisation computed here in numpy.
"""

import functools
import hashlib
import os

import jax
import numpy as np
import pytest
import scipy.stats
import torch
from transformers import AutoTokenizer, BertConfig, BertForPreTraining, BertModel

import bertjax
from bertjax.cli import embed
from bertjax.cli import evaluate
from bertjax.inference.api import Model
from bertjax.evaluation import lee
from bertjax.core.errors import UserError
from bertjax.evaluation import correlation, similarity, tfidf
from cli_checks import assert_one_line_error, run_cli
from hf_reference import save_hf_dir

TOL = dict(atol=1e-5, rtol=1e-5)
SHORT = 48  # a limit that cuts some of the real sentences below


@pytest.fixture(scope="module")
def minilm(minilm_dir):
    return bertjax.load(minilm_dir)


@pytest.fixture(scope="module")
def hf(minilm_dir):
    model = BertModel.from_pretrained(minilm_dir, attn_implementation="eager").eval()
    return model, AutoTokenizer.from_pretrained(minilm_dir)


@pytest.fixture(scope="module")
def sentences(demo_articles):
    """Real Wikipedia sentences: single ones, and runs of three that exceed SHORT tokens."""
    singles = [doc[0] for doc in demo_articles[:8]]
    runs = [" ".join(doc[1:4]) for doc in demo_articles[8:12]]
    return singles + runs


def hf_states(hf, texts, max_len):
    """(hidden states [L+1, B, T, H], attention mask [B, T]) from transformers, in numpy."""
    model, tokenizer = hf
    batch = tokenizer(texts, padding=True, truncation=True, max_length=max_len,
                      return_tensors="pt")
    with torch.no_grad():
        out = model(**batch, output_hidden_states=True)
    states = np.stack([h.numpy() for h in out.hidden_states])
    return states, batch["attention_mask"].numpy()


def mean_pool(states, mask):
    weights = mask[..., None].astype(np.float64)
    return (states * weights).sum(-2) / weights.sum(-2)


def unit(vectors):
    return vectors / np.linalg.norm(vectors, axis=-1, keepdims=True)


@pytest.fixture(scope="module")
def short_model(minilm):
    return Model(minilm.loaded, max_seq_len=SHORT)


@pytest.mark.slow
def test_mean_pooled_normalized_embeddings_equal_transformers(short_model, hf, sentences, capsys):
    capsys.readouterr()
    ours = short_model.embed(sentences, pooling="mean", normalize=True)
    states, mask = hf_states(hf, sentences, SHORT)
    cut = sum(len(hf[1](s)["input_ids"]) > SHORT for s in sentences)
    assert 2 <= cut < len(sentences)  # both truncated and whole sentences are compared
    assert f"note: {cut} text(s) truncated to {SHORT} tokens" in capsys.readouterr().err
    assert ours.shape == (len(sentences), 384) and ours.dtype == np.float32
    np.testing.assert_allclose(ours, unit(mean_pool(states[-1], mask)), **TOL)
    np.testing.assert_allclose(np.linalg.norm(ours, axis=1), 1.0, atol=1e-6)


def test_every_layer_equals_transformers_hidden_states(short_model, hf, sentences):
    encoded = short_model.encode(sentences, layers="all")
    states, mask = hf_states(hf, sentences, SHORT)
    assert states.shape[0] == 7
    for row, item in enumerate(encoded):
        length = int(mask[row].sum())
        tokens = hf[1].convert_ids_to_tokens(hf[1](sentences[row], truncation=True,
                                                   max_length=SHORT)["input_ids"])
        assert item.tokens == tokens and item.hidden.shape == (7, length, 384)
        np.testing.assert_allclose(item.hidden, states[:, row, :length], **TOL)


@pytest.mark.slow
def test_cls_max_and_last4_mean_poolings_equal_numpy_over_transformers_states(
        short_model, hf, sentences):
    states, mask = hf_states(hf, sentences, SHORT)
    masked = np.where(mask[..., None] > 0, states[-1], -np.inf)
    expected = {"cls": states[-1][:, 0], "max": masked.max(axis=1),
                "last4_mean": mean_pool(states[-4:].mean(axis=0), mask)}
    for pooling, vectors in expected.items():
        np.testing.assert_allclose(short_model.embed(sentences, pooling=pooling), vectors, **TOL,
                                   err_msg=pooling)


@pytest.mark.slow
def test_minilm_similarity_on_lee_tracks_human_ratings_better_than_tfidf(minilm, hf):
    corpus = lee.load()
    truncated = minilm.truncated
    vectors = minilm.embed(corpus.documents, pooling="mean")
    assert minilm.truncated == truncated
    states, mask = hf_states(hf, corpus.documents, 512)
    assert mask.sum(axis=1).max() < 512  # nothing was truncated: full-length parity
    np.testing.assert_allclose(vectors, mean_pool(states[-1], mask), **TOL)

    # What `evaluate similarity` computes (its model_scores runs on the tiny model below).
    cosines = similarity.pair_cosines(vectors, corpus.pairs)
    model = similarity.score("mean", cosines, corpus.ratings)
    baseline = similarity.baseline_score(corpus)
    # Measured: MiniLM mean pooling Spearman 0.508 (Pearson 0.656); TF-IDF 0.236 (0.445).
    assert model.spearman > 0.4 and model.pearson > 0.5
    assert 0.1 < baseline.spearman < model.spearman - 0.1
    assert model.spearman == pytest.approx(scipy.stats.spearmanr(cosines, corpus.ratings)[0])


def test_lee_corpus_is_the_50_documents_and_their_1225_rated_pairs():
    corpus = lee.load()
    assert len(corpus.documents) == 50 and corpus.pairs.shape == (1225, 2)
    assert (corpus.pairs[:, 0] < corpus.pairs[:, 1]).all()
    assert corpus.ratings.min() == pytest.approx(0.2) and corpus.ratings.max() == 1.0
    assert corpus.documents[0].startswith("The national executive of the strife-torn Democrats")
    assert any("£" in doc for doc in corpus.documents)  # Latin-1 decoded


def test_spearman_with_ties_and_pearson_equal_scipy():
    ratings = lee.load().ratings  # many tied ratings
    assert len(np.unique(ratings)) < len(ratings) / 10
    noisy = ratings + np.random.default_rng(0).normal(0, 0.1, len(ratings))
    for x in (noisy, np.round(noisy, 1)):
        assert correlation.spearman(x, ratings) == pytest.approx(
            scipy.stats.spearmanr(x, ratings)[0], abs=1e-12)
        assert correlation.pearson(x, ratings) == pytest.approx(
            scipy.stats.pearsonr(x, ratings)[0], abs=1e-12)
    assert np.isnan(correlation.pearson(np.ones(5), np.arange(5)))


def test_numpy_tfidf_is_smoothed_idf_weighted_counts_of_unit_length():
    docs = ["The cat sat on the cat.", "the cat", "Dogs bark; a dog barks."]
    vectors = tfidf.numpy_vectors(docs)
    # vocabulary: bark barks cat dog dogs on sat the ("a" is too short)
    assert vectors.shape == (3, 8)
    idf = lambda df: np.log(4 / (1 + df)) + 1  # noqa: E731
    first = np.array([0, 0, 2 * idf(2), 0, 0, idf(1), idf(1), 2 * idf(2)])
    np.testing.assert_allclose(vectors[0], first / np.linalg.norm(first))
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0)
    assert vectors[0] @ vectors[2] == 0 and vectors[0] @ vectors[1] > 0.5


# ---- the command line, on a tiny random BERT (fast to load and compile) ----------------------
# With its pretraining heads: a bare BertModel makes the loader initialize them (one more compile).

@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory, bert_vocab_path):
    config = BertConfig(vocab_size=30522, hidden_size=32, num_attention_heads=4,
                        intermediate_size=48, num_hidden_layers=3, max_position_embeddings=40)
    torch.manual_seed(0)
    return save_hf_dir(tmp_path_factory.mktemp("tiny_hf"), BertForPreTraining(config).eval(),
                       bert_vocab_path)


@pytest.mark.slow
def test_the_weights_are_an_argument_of_each_compiled_function_not_a_constant(tiny_dir):
    """Closed over, the weights would be constants of every compiled function (each pooling,
    head and bucket shape compiling and caching its own copy)."""
    model = bertjax.load(tiny_dir)
    model.embed(["the bank of the river"], pooling="cls")
    model.fill_mask("the [MASK] of the river")
    weight_bytes = sum(x.nbytes for x in jax.tree.leaves(model.loaded.params))
    batch = {key: np.zeros((8, 16), np.int32) for key in ("input_ids", "segment_ids",
                                                         "input_mask")}
    assert len(model._compiled) == 2
    for key, fn in model._compiled.items():
        inputs = {**batch, "masked_positions": np.zeros((8, key[1]), np.int32)} if (
            key[0] == "fill_mask") else batch
        jitted, bound = (fn.func, fn.args) if isinstance(fn, functools.partial) else (fn, ())
        program = jitted.lower(*bound, inputs).as_text()
        assert len(program) < weight_bytes / 4, (key, len(program), weight_bytes)


def md5(path):
    with open(path, "rb") as f:
        return hashlib.md5(f.read()).hexdigest()


@pytest.mark.slow
def test_embed_cli_writes_what_the_api_returns(tmp_path, capsys, tiny_dir, sentences):
    texts = sentences[:2] + [""] + sentences[-2:]  # a blank line keeps its row
    source = tmp_path / "texts.txt"
    source.write_text("\n".join(texts) + "\n", encoding="utf-8")
    out = str(tmp_path / "vectors.npy")
    argv = ["--model", tiny_dir, "--input", str(source), "--output", out,
            "--pooling", "last4_mean", "--layers", "0,2,3", "--normalize", "--batch-size", "8"]
    code, stdout, err = run_cli(embed, argv, capsys)
    assert code == 0, err
    assert f"wrote 5 x 32 embeddings (last4_mean pooling) to {out}" in stdout
    assert "note: 2 text(s) truncated to 40 tokens" in err  # the runs of three sentences
    assert "note: 1 blank line(s) embedded as empty texts" in err
    vectors = np.load(out)
    assert vectors.shape == (5, 32) and vectors.dtype == np.float32
    model = bertjax.load(tiny_dir, batch_size=8)
    np.testing.assert_allclose(vectors, model.embed(texts, "last4_mean", layers=[0, 2, 3],
                                                    normalize=True), atol=1e-6)
    assert sorted(os.listdir(tmp_path)) == ["texts.txt", "vectors.npy"]

    # --overwrite replaces it (here with another pooling and a shorter limit).
    code, _, err = run_cli(embed, argv[:6] + ["--pooling", "cls", "--max-seq-len", "8",
                                              "--overwrite"], capsys)
    assert code == 0 and "note: 4 text(s) truncated to 8 tokens" in err, err
    np.testing.assert_allclose(np.load(out), Model(model.loaded, max_seq_len=8).embed(
        texts, "cls"), atol=1e-6)


def test_embed_cli_bad_input_is_one_line_exit_2_and_writes_nothing(tmp_path, capsys, tiny_dir):
    good = tmp_path / "texts.txt"
    good.write_text("a first text\nanother one\n", encoding="utf-8")
    (tmp_path / "empty.txt").write_text("", encoding="utf-8")
    (tmp_path / "blank.txt").write_text("\n  \n\n", encoding="utf-8")
    (tmp_path / "latin1.txt").write_bytes("price: £5\n".encode("latin-1"))
    (tmp_path / "not_a_model").mkdir()
    (tmp_path / "a_file").write_text("x", encoding="utf-8")
    existing = tmp_path / "existing.npy"
    np.save(existing, np.arange(3.0))
    kept = {p: md5(tmp_path / p) for p in ("texts.txt", "existing.npy")}
    before = sorted(os.listdir(tmp_path))

    def run(phrase, *extra, output="new.npy", model=tiny_dir, source=str(good)):
        argv = ["--model", model, "--input", source, "--output", str(tmp_path / output),
                "--pooling", "mean", *extra]
        code, _, err = run_cli(embed, argv, capsys)
        assert_one_line_error(code, err, phrase)
        assert sorted(os.listdir(tmp_path)) == before, phrase

    run("has no text", source=str(tmp_path / "empty.txt"))
    run("has no text", source=str(tmp_path / "blank.txt"))
    run("input file not found", source=str(tmp_path / "missing.txt"))
    run("is not UTF-8 text (byte 7)", source=str(tmp_path / "latin1.txt"))
    run("is not a model", model=str(tmp_path / "not_a_model"))
    run("is not a model", model=str(good))
    run("checkpoint not found", model=str(tmp_path / "nowhere"))
    run("already exists; choose a new output or pass --overwrite", output="existing.npy")
    run("is not an existing directory", output="a_file/new.npy")
    run("is not an existing directory", output="no_dir/new.npy")
    run("is a directory", output="not_a_model")
    run("would replace the input", "--overwrite", output="texts.txt")
    run("invalid choice: 'sum'", "--pooling", "sum")
    run("--layers 'last'", "--layers", "last")
    run("layer 4 does not exist", "--layers", "4")  # found after the model has loaded
    run("max_seq_len must be an integer of at least 3, got 0", "--max-seq-len", "0")
    run("batch_size must be an integer of at least 1, got 0", "--batch-size", "0")
    assert {p: md5(tmp_path / p) for p in kept} == kept


def test_evaluate_dispatches_similarity_and_refuses_unknown_subcommands(capsys, tiny_dir):
    code, stdout, err = run_cli(evaluate, ["similarity", "--model", tiny_dir,
                                           "--pooling", "cls", "max"], capsys)
    assert code == 0, err
    lines = stdout.splitlines()
    assert lines[0].startswith("Lee et al. (2005): 50 documents, 1225 pairs")
    rows = {line.rsplit(None, 2)[0]: [float(x) for x in line.split()[-2:]] for line in lines[2:5]}
    methods = list(rows)
    assert methods[:2] == ["model, cls pooling", "model, max pooling"]
    assert methods[2].startswith("TF-IDF cosine")
    assert all(np.isfinite(v).all() and -1 <= min(v) <= max(v) <= 1 for v in rows.values())
    baseline = similarity.baseline_score(lee.load())
    assert rows[methods[2]] == pytest.approx([baseline.spearman, baseline.pearson], abs=1e-4)
    assert lines[5] == "truncated: 50 of 50 documents to 40 tokens"

    for argv, phrase in (([], "no subcommand given"), (["retrieval"], "unknown subcommand"),
                         (["similarity", "--model", tiny_dir, "--pooling", "sum"],
                          "invalid choice")):
        code, _, err = run_cli(evaluate, argv, capsys)
        assert_one_line_error(code, err, phrase)


def test_a_max_seq_len_of_zero_is_refused_not_taken_as_the_models_limit(minilm):
    with pytest.raises(UserError, match="max_seq_len must be an integer of at least 3, got 0"):
        Model(minilm.loaded, max_seq_len=0)
