"""`bertjax.load(path)` and the Model it returns: every layer's states (scan and loop), the length
buckets, the MLM head's fill_mask, a fine-tuned run's predict (the same as predict mode), and bad
input as one UserError. Numerics against transformers are in tests/test_embed.py."""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import bertjax
from bertjax.cli import main as bertjax_main
from bertjax.core.errors import UserError
from bertjax.core.length_buckets import bucket_length, bucket_rows
from bertjax.model import layout
from bertjax.model.encoder import Encoder
from bertjax.model.heads import BertForPretraining
from bertjax.model.task_heads import SequenceClassifier
from saved_runs import api_config as config
from saved_runs import random_params, save_workdir

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SENTENCES = ["The cat sat on the mat.", "A very long sentence " + "with many words " * 25,
             "Paris is the capital of France.", "short", "Two men are playing chess in a park.",
             "The bank of the river was muddy after the rain."]


@pytest.mark.slow
def test_all_layers_are_the_same_with_scan_and_with_a_loop(pretrained):
    _, params = pretrained
    encoder_params = params["encoder"]
    rng = np.random.default_rng(0)
    ids = jnp.asarray(rng.integers(5, 30000, (2, 12)), jnp.int32)
    segments = jnp.zeros_like(ids)
    mask = jnp.ones_like(ids).at[1, 9:].set(0)
    scanned = Encoder(config(True), all_layers=True).apply(
        {"params": encoder_params}, ids, segments, mask)
    looped = Encoder(config(False), all_layers=True).apply(
        {"params": layout.to_unscanned(encoder_params)}, ids, segments, mask)
    plain = Encoder(config(True)).apply({"params": encoder_params}, ids, segments, mask)
    assert scanned.layers.shape == (4, 2, 12, 32) and plain.layers is None
    np.testing.assert_allclose(scanned.layers, looped.layers, atol=1e-5, rtol=1e-5)
    np.testing.assert_array_equal(scanned.layers[-1], scanned.sequence)
    np.testing.assert_array_equal(scanned.sequence, plain.sequence)


@pytest.mark.slow
def test_buckets_keep_shapes_few_and_results_independent_of_the_batch(pretrained):
    assert [bucket_length(n, 8, 64) for n in (1, 8, 9, 63, 64, 100)] == [8, 8, 16, 64, 64, 64]
    assert [bucket_rows(n, 32) for n in (1, 3, 5, 32, 33)] == [1, 4, 8, 32, 32]
    workdir, _ = pretrained
    together = bertjax.load(workdir, batch_size=4)
    vectors = together.embed(SENTENCES, pooling="mean")
    alone = bertjax.load(workdir, batch_size=1)
    one_by_one = np.concatenate([alone.embed([s], pooling="mean") for s in SENTENCES])
    np.testing.assert_allclose(vectors, one_by_one, atol=1e-5, rtol=1e-5)
    assert together.truncated == 1  # the long sentence is cut to the 64 positions


@pytest.mark.slow
def test_poolings_and_layer_selection_follow_the_token_states(pretrained):
    workdir, _ = pretrained
    model = bertjax.load(workdir)
    encoded = model.encode(SENTENCES[:3], layers="all")
    assert encoded[0].tokens[0] == "[CLS]" and encoded[0].tokens[-1] == "[SEP]"
    assert encoded[0].hidden.shape == (4, len(encoded[0].ids), 32)
    last = model.encode(SENTENCES[:3], layers=-1)
    np.testing.assert_allclose(last[2].hidden[0], encoded[2].hidden[-1], atol=1e-6)
    expected = {"cls": [e.hidden[-1][0] for e in encoded],
                "mean": [e.hidden[-1].mean(0) for e in encoded],
                "max": [e.hidden[-1].max(0) for e in encoded],
                "last4_mean": [e.hidden[-4:].mean(0).mean(0) for e in encoded]}
    for pooling, rows in expected.items():
        np.testing.assert_allclose(model.embed(SENTENCES[:3], pooling=pooling), np.stack(rows),
                                   atol=1e-5, rtol=1e-5, err_msg=pooling)
    chosen = model.embed(SENTENCES[:3], pooling="mean", layers=[1])
    np.testing.assert_allclose(chosen, np.stack([e.hidden[1].mean(0) for e in encoded]),
                               atol=1e-5, rtol=1e-5)
    unit = model.embed(SENTENCES[:3], normalize=True)
    np.testing.assert_allclose(np.linalg.norm(unit, axis=1), 1.0, atol=1e-5)
    np.testing.assert_allclose(model.similarity(SENTENCES[:3], SENTENCES[:2]), unit @ unit[:2].T,
                               atol=1e-5)
    words = model.word_vectors([["the", "unbelievable", "cat"]], layers=-1)[0]
    states = model.encode(["the unbelievable cat"], layers=-1)[0]
    pieces = len(states.ids) - 4  # [CLS] the <pieces of unbelievable> cat [SEP]
    np.testing.assert_allclose(words[1], states.hidden[0, 2:2 + pieces].mean(0), atol=1e-5)


@pytest.mark.slow
def test_fill_mask_is_the_mlm_head_at_the_mask(pretrained):
    workdir, params = pretrained
    model = bertjax.load(workdir)
    found = model.fill_mask("paris is the [MASK] of france.", top_k=3)
    assert len(found) == 1 and len(found[0]) == 3
    row = model._masked_row("paris is the [MASK] of france.")[0]
    position = int(np.flatnonzero(row == model.tokenizer.special.mask)[0])
    batch = {"input_ids": row[None], "segment_ids": np.zeros_like(row)[None],
             "input_mask": np.ones_like(row)[None],
             "masked_positions": np.array([[position]], np.int32)}
    logits = jax.jit(BertForPretraining(config(True), nsp=True).apply)({"params": params}, batch)
    probs = np.asarray(jax.nn.softmax(logits["mlm_logits"][0, 0]))
    best = np.argsort(-probs)[:3]
    assert [t for t, _ in found[0]] == [model.tokenizer.id_to_token(int(i)) for i in best]
    np.testing.assert_allclose([p for _, p in found[0]], probs[best], rtol=1e-4)
    two = model.fill_mask(["[MASK] is [MASK].", "a [MASK]"], top_k=1)
    assert [len(t) for t in two] == [2, 1]


def test_fill_mask_compiles_once_per_length_bucket_not_per_length(pretrained):
    """Texts of eight lengths (6-13 tokens) run as one batch padded to one bucket (16 tokens):
    one compile, not one per length, and each text's answer is the one it gets alone."""
    model = bertjax.load(pretrained[0])
    texts = ["the [MASK] " + "cat " * n + "sat." for n in range(8)]
    assert sorted({len(model._masked_row(t)[0]) for t in texts}) == list(range(6, 14))
    together = model.fill_mask(texts, top_k=2)
    jitted = model._compiled[("fill_mask", 1, 2)].func
    assert jitted._cache_size() == 1
    for text, found in zip(texts, together):
        alone = model.fill_mask(text, top_k=2)
        assert [t for t, _ in found[0]] == [t for t, _ in alone[0]]
        np.testing.assert_allclose([p for _, p in found[0]], [p for _, p in alone[0]], rtol=1e-5)


@pytest.mark.slow
def test_predict_of_a_fine_tuned_run_is_what_predict_mode_writes(tmp_path, tokenizer_dir):
    cfg = config(True)
    classifier = SequenceClassifier(cfg, num_labels=2)
    batch = {k: jnp.zeros((1, 4), jnp.int32) for k in ("input_ids", "segment_ids", "input_mask")}
    params = random_params(classifier, (batch,), 5)
    workdir = str(tmp_path / "run")
    save_workdir(workdir, params, cfg, task="finetune_classification",
                 heads={"labels": ["neg", "pos"]}, tokenizer_dir=tokenizer_dir)
    with open(os.path.join(workdir, "run.json")) as f:
        record = json.load(f)
    record["task_settings"] = {"max_seq_len": 32}
    with open(os.path.join(workdir, "run.json"), "w") as f:
        json.dump(record, f)
    texts = SENTENCES[:4]
    predicted = bertjax.load(workdir).predict(texts)
    data = tmp_path / "predict.tsv"
    data.write_text("sentence\n" + "".join(t + "\n" for t in texts), encoding="utf-8")
    output = tmp_path / "predictions.jsonl"
    code = bertjax_main.main(["bertjax.cli.main", f"--config={REPO}/configs/finetune_sentiment.py",
                              f"--workdir={workdir}", "--config.mode=predict",
                              f"--config.data.predict={data}",
                              f"--config.predict_output={output}"])
    assert code == 0
    written = [json.loads(line) for line in output.read_text().splitlines()]
    assert [p["label"] for p in predicted] == [w["label"] for w in written]
    np.testing.assert_allclose([[p["probabilities"][k] for k in ("neg", "pos")] for p in predicted],
                               [[w["probabilities"][k] for k in ("neg", "pos")] for w in written],
                               atol=1e-6)
    assert {p["label"] for p in predicted} <= {"neg", "pos"}


def test_bad_input_is_one_user_error(pretrained, tmp_path):
    workdir, _ = pretrained
    model = bertjax.load(workdir)
    cases = [(lambda: model.embed(SENTENCES, pooling="median"), "unknown pooling"),
             (lambda: model.encode(SENTENCES, layers=4), "layer 4 does not exist"),
             (lambda: model.encode(SENTENCES, layers="last"), "layers='last'"),
             (lambda: model.embed("one string"), "a list of texts"),
             (lambda: model.fill_mask("no mask here"), "no [MASK]"),
             (lambda: model.predict(SENTENCES), "not a fine-tuned run"),
             (lambda: bertjax.load(str(tmp_path)), "is not a model"),
             (lambda: bertjax.load(str(tmp_path / "absent")), "not found")]
    for call, message in cases:
        with pytest.raises(UserError, match=None) as raised:
            call()
        assert message in str(raised.value), (message, str(raised.value))
    assert model.embed([]).shape == (0, 32)
