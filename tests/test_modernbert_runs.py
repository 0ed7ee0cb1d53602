"""A ModernBERT-style pretraining run end to end on real text: MLM on full sentences, 30% masking,
the short phase at its own rotary base and the long one at the model's; resumed bit for bit after
SIGKILL across the length switch; then fine-tuned, embedded and refused like any BERT run."""

import json
import os
import signal

import numpy as np
import pytest
import transformers

import bertjax
import cli_in_process
from bertjax.inference import loading
from finetune_runs import finetune, results
from pretrain_runs import run_child, tiny_args
from test_pretrain import logged
from trees import flat


def modern_args(workdir, corpus_dir, **overrides):
    """tiny_args' 12 steps (32 tokens, then 64 from step 9) on ModernBERT's config, tiny."""
    settings = {"model.preset": "tiny", "model.max_position_embeddings": 128,
                "model.sliding_window": 16, "optimizer.warmup_steps": 3,
                "schedule.long_max_predictions": 20, **overrides}
    args = tiny_args(workdir, corpus_dir, **settings)
    return [arg.replace("configs/tiny.py", "configs/modernbert.py") for arg in args]


@pytest.fixture(scope="module")
def straight_run(tmp_path_factory, small_corpus_dir):
    workdir = str(tmp_path_factory.mktemp("modernbert") / "straight")
    result = run_child(modern_args(workdir, small_corpus_dir))
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir


@pytest.mark.slow
def test_the_run_trains_modernberts_model(straight_run):
    train = [r for r in logged(straight_run) if "loss" in r]
    assert [r["seq_len"] for r in train] == [32] * 8 + [64] * 4
    assert all(np.isfinite(r["mlm_loss"]) for r in train) and "nsp_loss" not in train[0]
    record = json.load(open(os.path.join(straight_run, "run.json")))
    encoder = record["encoder"]
    assert encoder["norm"] == "pre" and encoder["mlp"] == "geglu"
    assert encoder["position_embedding"] == "rope" and encoder["rope_theta"] == 160_000.0
    params = flat(loading.load(straight_run).params)
    assert "encoder/final_norm/scale" in params
    assert not any(k.endswith("/bias") and "/layers/" in k for k in params)


@pytest.mark.slow
def test_exact_resume_after_sigkill_across_the_length_switch(straight_run, tmp_path,
                                                             small_corpus_dir):
    """The short phase runs at rotary base 10,000 and the long one at 160,000: the resumed run
    compiles the long phase's model only, and still matches the straight run bit for bit."""
    resumed = str(tmp_path / "resumed")
    args = modern_args(resumed, small_corpus_dir)
    result = run_child(args, KILL_AFTER_CHECKPOINT=5)
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    result = run_child(args)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "resuming from step 5" in result.stderr
    assert logged(resumed) == logged(straight_run)
    a, b = flat(loading.load(straight_run).params), flat(loading.load(resumed).params)
    assert a.keys() == b.keys()
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


@pytest.mark.slow
def test_the_short_phases_rotary_base_changes_what_it_trains(straight_run, tmp_path,
                                                             small_corpus_dir):
    """The check above can fail: one rotary base for both phases computes another first loss
    (before any update, on the same batch from the same initial parameters)."""
    same = str(tmp_path / "same")
    result = run_child(modern_args(same, small_corpus_dir, **{
        "schedule.short_rope_theta": 0.0, "train.steps": 3}))
    assert result.returncode == 0, result.stderr[-2000:]
    ours = [r["loss"] for r in logged(same) if "loss" in r]
    theirs = [r["loss"] for r in logged(straight_run) if "loss" in r]
    assert np.isclose(ours[0], theirs[0], rtol=1e-3) and ours[0] != theirs[0]


@pytest.mark.slow
def test_a_modernbert_run_fine_tunes_predicts_and_embeds(straight_run, tmp_path):
    workdir = str(tmp_path / "sst")
    code = finetune("finetune_sentiment", workdir, **{
        "init_checkpoint": straight_run, "model.preset": "from_checkpoint",
        "data.max_train_examples": 200, "data.max_eval_examples": 100, "data.max_seq_len": 40,
        "train.epochs": 1})
    assert code == 0
    r = results(workdir)
    assert r["finished"] and 0.0 <= r["eval"]["accuracy"] <= 1.0
    assert loading.load(workdir, r["best_step"]).encoder.mlp == "geglu"
    source, output = tmp_path / "new.tsv", str(tmp_path / "predictions.jsonl")
    source.write_text("sentence\nA gorgeous, moving film.\nDull and lifeless.\n",
                      encoding="utf-8")
    assert finetune("finetune_sentiment", workdir, **{
        "mode": "predict", "data.predict": str(source), "predict_output": output}) == 0
    with open(output) as f:
        predictions = [json.loads(line) for line in f]
    assert [p["label"] in ("negative", "positive") for p in predictions] == [True, True]
    vectors = bertjax.load(straight_run).embed(["the river flows north", "a small town"])
    assert vectors.shape[0] == 2 and np.all(np.isfinite(vectors))


@pytest.mark.slow
def test_the_runs_export_loads_in_transformers_with_its_tokenizer(straight_run, tmp_path):
    """`export --format hf` of the run: ModernBertForMaskedLM with no missing or unexpected
    keys, and AutoTokenizer (a fast tokenizer only, for ModernBert) reading our WordPiece
    vocabulary as we do, with [CLS] and [SEP] around the text."""
    out = str(tmp_path / "hf")
    run = cli_in_process.run("export", "--workdir", straight_run, "--format", "hf",
                             "--output", out)
    assert run.returncode == 0, run.stderr
    model, info = transformers.ModernBertForMaskedLM.from_pretrained(
        out, output_loading_info=True)
    assert not info["missing_keys"] and not info["unexpected_keys"]
    ours = loading.load(straight_run).tokenizer()
    auto = transformers.AutoTokenizer.from_pretrained(out)
    for text in ("The river flows north of the old town.", "Zürich, 1990: a (small) test!"):
        expected = [ours.special.cls, *ours.encode(text).tolist(), ours.special.sep]
        assert auto(text)["input_ids"] == expected
