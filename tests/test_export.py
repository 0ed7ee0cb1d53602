"""`python -m bertjax.export`: pretraining and fine-tuning workdirs (saved train states with their
run records) exported params-only and in Hugging Face layout. transformers' `from_pretrained` on
the export must compute what our model computes, the tokenizer must give our ids, HF -> bertjax
must give the parameters back bit for bit, and bad input must write nothing.
"""

import dataclasses
import json
import os
import shutil

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from transformers import (AutoTokenizer, BertForMaskedLM, BertForPreTraining,
                          BertForQuestionAnswering, BertForSequenceClassification,
                          BertForTokenClassification)

from bertjax.core.errors import UserError
from bertjax.inference import loading
from bertjax.cli import convert
from bertjax.cli import export
from bertjax.data.tokenizer import WordPieceTokenizer, load_tokenizer
from bertjax.interop import hf_files, params_dir
from bertjax.model import layout
from bertjax.model.config import EncoderConfig
from bertjax.model.encoder import Encoder
from bertjax.model.heads import BertForPretraining
from bertjax.train import warm_start
from bertjax.train.checkpoint import Checkpointer
from bertjax.train.state import TrainState
from bertjax.jobs.run_directory import RunDirectory
from cli_checks import assert_one_line_error, leftovers, run_cli, snapshot
from hf_reference import PAIRS, TOL, run_hf, run_ours, text_batch
from saved_runs import STEP, random_params, save_workdir
from trees import flat



@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory, bert_vocab_path):
    """The real bert-base-uncased vocabulary, saved as a run saves its tokenizer."""
    directory = str(tmp_path_factory.mktemp("tokenizer") / "tokenizer")
    WordPieceTokenizer.from_vocab_file(bert_vocab_path).save(directory)
    return directory


def pretraining_workdir(root, tokenizer_dir, config, *, nsp=True, sbo=False, seed=0):
    model = BertForPretraining(config, nsp=nsp, sbo=sbo, max_span_length=4)
    batch = {k: jnp.zeros((1, 4), jnp.int32) for k in (
        "input_ids", "segment_ids", "input_mask", "masked_positions", "span_left", "span_right",
        "span_offset")}
    params = random_params(model, (batch,), seed)
    heads = {"nsp": nsp, "sbo": sbo, "max_span_length": 4}
    return save_workdir(str(root), params, config, task="pretrain", heads=heads,
                        tokenizer_dir=tokenizer_dir), params


def assert_same_tree(a, b):
    a, b = flat(a), flat(b)
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and np.array_equal(a[name], b[name]), name


def metadata_text(checkpoint):
    with open(os.path.join(checkpoint, "_METADATA")) as f:
        return f.read()


def config_of(hidden, heads, intermediate, layers, scan):
    return EncoderConfig(vocab_size=30522, hidden_size=hidden, num_heads=heads,
                         intermediate_size=intermediate, num_layers=layers,
                         max_position_embeddings=64, scan_layers=scan)


def test_params_export_has_no_optimizer_state_and_starts_a_run(tmp_path, capsys, tokenizer_dir):
    config = config_of(30, 3, 44, 2, True)
    workdir, params = pretraining_workdir(tmp_path / "wd", tokenizer_dir, config)
    out = str(tmp_path / "params")
    code, stdout, err = run_cli(export, ["--workdir", workdir, "--format", "params",
                                         "--output", out], capsys)
    assert code == 0 and "wrote the params-only export" in stdout, err

    bundle = loading.load(out)
    assert_same_tree(bundle.params, params)
    assert bundle.encoder == config and bundle.heads["nsp"] and bundle.info["step"] == STEP
    assert bundle.info["task"] == "pretrain"
    assert load_tokenizer(bundle.tokenizer_dir).vocab_size == 30522
    # The checkpoint's tree names AdamW's moments; the export's has the parameters alone.
    saved = metadata_text(os.path.join(workdir, "checkpoints", str(STEP), "state"))
    exported = metadata_text(os.path.join(out, params_dir.PARAMS_DIR))
    assert "opt_state" in saved and '"mu"' in saved
    assert "opt_state" not in exported and '"mu"' not in exported and '"step"' not in exported
    assert sorted(os.listdir(out)) == ["bertjax.json", "params", "tokenizer"]

    # As an init checkpoint: a model of the other layer layout gets every parameter.
    target = jax.tree.map(np.zeros_like, {**params, "encoder": layout.to_unscanned(
        params["encoder"])})
    device = jax.sharding.SingleDeviceSharding(jax.devices()[0])
    loaded = warm_start.load_params(out, loading.load(out).params, target,
                                    jax.tree.map(lambda _: device, target))
    assert_same_tree(jax.device_get(loaded), {**params, "encoder": layout.to_unscanned(
        params["encoder"])})


SHAPES = [  # hidden, heads, intermediate, layers, scan, token types
    (60, 5, 150, 2, True, True),
    (63, 7, 130, 1, False, False),
]


@pytest.mark.parametrize("hidden,heads,intermediate,layers,scan,token_types", SHAPES)
@pytest.mark.slow
def test_hf_export_loads_in_transformers_computes_the_same_and_converts_back_bit_for_bit(
        tmp_path, capsys, tokenizer_dir, bert_vocab_path, hidden, heads, intermediate, layers,
        scan, token_types):
    config = config_of(hidden, heads, intermediate, layers, scan)
    workdir, params = pretraining_workdir(tmp_path / "wd", tokenizer_dir, config, seed=layers)
    out = str(tmp_path / "hf")
    code, _, err = run_cli(export, ["--workdir", workdir, "--format", "hf", "--output", out],
                           capsys)
    assert code == 0 and err == "", err
    assert sorted(os.listdir(out)) == ["config.json", "model.safetensors",
                                       "special_tokens_map.json", "tokenizer_config.json",
                                       "vocab.txt"]

    hf = BertForPreTraining.from_pretrained(out, attn_implementation="eager").eval()
    assert hf.config.architectures == ["BertForPreTraining"]
    batch = text_batch(bert_vocab_path, pairs=token_types, seed=layers)
    ours, sequence, pooled = run_ours(params, config, batch)
    mlm, nsp, hf_sequence, hf_pooled = run_hf(hf, batch, token_types)
    np.testing.assert_allclose(sequence, hf_sequence, **TOL)
    np.testing.assert_allclose(pooled, hf_pooled, **TOL)
    np.testing.assert_allclose(ours["mlm_logits"], mlm, **TOL)
    np.testing.assert_allclose(ours["nsp_logits"], nsp, **TOL)

    # transformers' tokenizer of the export gives our ids, [CLS] A [SEP] B [SEP] and segments.
    ours_tok, theirs = load_tokenizer(tokenizer_dir), AutoTokenizer.from_pretrained(out)
    sp = ours_tok.special
    for first, second in PAIRS:
        a, b = ours_tok.encode(first).tolist(), ours_tok.encode(second).tolist()
        encoded = theirs(first, second)
        assert encoded["input_ids"] == [sp.cls, *a, sp.sep, *b, sp.sep]
        assert encoded["token_type_ids"] == [0] * (len(a) + 2) + [1] * (len(b) + 1)

    back = str(tmp_path / "back")
    argv = ["--from-hf", out, "--output", back] + ([] if scan else ["--no-scan-layers"])
    code, _, err = run_cli(convert, argv, capsys)
    assert code == 0 and "initialized" not in err, err
    assert_same_tree(loading.load(back).params, params)


@pytest.mark.slow
def test_a_model_without_nsp_exports_as_masked_lm_and_names_what_is_left_out(
        tmp_path, capsys, tokenizer_dir, bert_vocab_path):
    config = config_of(30, 3, 44, 2, True)
    workdir, params = pretraining_workdir(tmp_path / "wd", tokenizer_dir, config, nsp=False,
                                          sbo=True)
    out = str(tmp_path / "hf")
    code, _, err = run_cli(export, ["--workdir", workdir, "--format", "hf", "--output", out],
                           capsys)
    assert code == 0, err
    warnings = err.strip().split("\n")
    assert len(warnings) == 2 and all(w.startswith("bertjax: warning: ") for w in warnings)
    assert "span boundary head (sbo)" in err and "BertForMaskedLM" in err

    hf = BertForMaskedLM.from_pretrained(out, attn_implementation="eager").eval()
    assert hf.config.architectures == ["BertForMaskedLM"]
    batch = text_batch(bert_vocab_path, pairs=True)
    model = BertForPretraining(config, nsp=False)
    ours = jax.jit(model.apply)({"params": {k: params[k] for k in ("encoder", "mlm")}}, batch)
    with torch.no_grad():
        logits = hf(input_ids=torch.from_numpy(batch["input_ids"]).long(),
                    attention_mask=torch.from_numpy(batch["input_mask"]).long(),
                    token_type_ids=torch.from_numpy(batch["segment_ids"]).long()).logits
    masked = np.take_along_axis(logits.numpy(), batch["masked_positions"][..., None], axis=1)
    np.testing.assert_allclose(ours["mlm_logits"], masked, **TOL)

    # transformers' own BertForMaskedLM save has no pooler: converting it back initializes the
    # pooler and the NSP head, says so, and takes everything else bit for bit.
    saved = tmp_path / "saved"
    hf.save_pretrained(saved)
    for name in ("vocab.txt", "tokenizer_config.json"):
        shutil.copy(os.path.join(out, name), saved / name)
    code, _, err = run_cli(convert, ["--from-hf", str(saved), "--output",
                                     str(tmp_path / "back")], capsys)
    assert code == 0, err
    assert "initialized fresh" in err and "the pooler (bert.pooler), the NSP head" in err, err
    back = flat(loading.load(str(tmp_path / "back")).params)
    kept = {k: v for k, v in flat({k: params[k] for k in ("encoder", "mlm")}).items()
            if "/pooler/" not in k}
    for name, value in kept.items():
        assert np.array_equal(back[name], value), name
    assert not np.array_equal(back["encoder/pooler/kernel"], params["encoder"]["pooler"]["kernel"])


FINETUNED = [  # head, labels, HF class, output layer
    ("sequence_classification", ["negative", "neutral", "positive"],
     BertForSequenceClassification, "classifier"),
    ("regression", ["score"], BertForSequenceClassification, "classifier"),
    ("token_classification", ["O", "B-PER", "I-PER", "B-LOC", "I-LOC"],
     BertForTokenClassification, "classifier"),
    ("question_answering", ["start", "end"], BertForQuestionAnswering, "qa_outputs"),
]


@pytest.fixture(scope="module")
def encoder_outputs(bert_vocab_path):
    """One random encoder and its outputs on real sentences: what every head reads."""
    config = config_of(48, 3, 80, 2, True)
    batch = text_batch(bert_vocab_path, pairs=True)
    inputs = (batch["input_ids"], batch["segment_ids"], batch["input_mask"])
    params = random_params(Encoder(config), inputs, seed=3)
    encoded = jax.jit(Encoder(config).apply)({"params": params}, *inputs)
    return config, params, batch, np.asarray(encoded.sequence), np.asarray(encoded.pooled)


@pytest.mark.parametrize("head,labels,hf_class,layer", FINETUNED, ids=[f[0] for f in FINETUNED])
@pytest.mark.slow
def test_fine_tuned_checkpoints_export_to_their_transformers_class(
        tmp_path, capsys, tokenizer_dir, encoder_outputs, head, labels, hf_class, layer):
    config, encoder, batch, sequence, pooled = encoder_outputs
    rng = np.random.default_rng(len(labels))
    kernel = rng.normal(0, 0.5, (config.hidden_size, len(labels))).astype(np.float32)
    bias = rng.normal(0, 0.5, len(labels)).astype(np.float32)
    params = {"encoder": encoder, layer: {"kernel": kernel, "bias": bias}}
    crf = head == "token_classification"  # the tagger is exported with its CRF left out
    if crf:
        params["crf"] = {"transitions": rng.normal(size=(5, 5)).astype(np.float32)}
    heads = {"head": head, "num_labels": len(labels), "labels": labels, "crf": crf}
    workdir = save_workdir(str(tmp_path / "wd"), params, config, task=f"finetune_{head}",
                           heads=heads, tokenizer_dir=tokenizer_dir)
    out = str(tmp_path / "hf")
    code, _, err = run_cli(export, ["--workdir", workdir, "--format", "hf", "--output", out],
                           capsys)
    assert code == 0, err
    if crf:
        assert err.startswith("bertjax: warning: the CRF transition scores") and err.count(
            "\n") == 1, err
    else:
        assert err == ""
    with open(os.path.join(out, "config.json")) as f:
        saved = json.load(f)
    assert saved["architectures"] == [hf_class.__name__]
    assert saved["id2label"] == {str(i): label for i, label in enumerate(labels)}
    assert saved["label2id"] == {label: i for i, label in enumerate(labels)}
    assert saved.get("problem_type") == {"sequence_classification": "single_label_classification",
                                         "regression": "regression"}.get(head)

    hf = hf_class.from_pretrained(out, attn_implementation="eager").eval()
    assert hf.config.num_labels == len(labels)
    args = {"input_ids": torch.from_numpy(batch["input_ids"]).long(),
            "attention_mask": torch.from_numpy(batch["input_mask"]).long(),
            "token_type_ids": torch.from_numpy(batch["segment_ids"]).long()}
    with torch.no_grad():
        output = hf(**args)
    if layer == "qa_outputs":
        spans = sequence @ kernel + bias
        np.testing.assert_allclose(output.start_logits.numpy(), spans[..., 0], **TOL)
        np.testing.assert_allclose(output.end_logits.numpy(), spans[..., 1], **TOL)
    else:
        features = pooled if hf_class is BertForSequenceClassification else sequence
        np.testing.assert_allclose(output.logits.numpy(), features @ kernel + bias, **TOL)


@pytest.fixture(scope="module")
def small_workdir(tmp_path_factory, tokenizer_dir):
    root = tmp_path_factory.mktemp("small")
    workdir, _ = pretraining_workdir(root / "wd", tokenizer_dir, config_of(30, 3, 44, 1, True))
    return workdir


def run_export(capsys, *argv):
    return run_cli(export, list(argv), capsys)


def test_bad_sources_are_one_line_exit_2_and_write_nothing(tmp_path, capsys, small_workdir):
    out = str(tmp_path / "out")
    (tmp_path / "plain").mkdir()
    no_record = tmp_path / "no_record"
    shutil.copytree(small_workdir, no_record)
    os.remove(no_record / "run.json")
    cases = [
        (["--workdir", str(tmp_path / "missing"), "--format", "hf"], ["checkpoint not found"]),
        (["--workdir", str(tmp_path / "plain"), "--format", "hf"], ["neither a bertjax workdir"]),
        (["--workdir", str(no_record), "--format", "params"], ["does not record its model"]),
        (["--workdir", small_workdir, "--format", "hf", "--step", "99"],
         ["no checkpoint of step 99", f"[{STEP}]"]),
        (["--workdir", small_workdir, "--format", "onnx"], ["invalid choice: 'onnx'"]),
        (["--workdir", small_workdir, "--format", "hf", "--tokenizer", str(tmp_path / "none")],
         ["tokenizer not found"]),
    ]
    for argv, phrases in cases:
        code, _, err = run_export(capsys, *argv, "--output", out)
        assert_one_line_error(code, err, *phrases)
        assert not os.path.exists(out) and not leftovers(tmp_path), argv


@pytest.mark.slow
def test_head_records_that_do_not_fit_the_parameters_are_refused(
        tmp_path, capsys, tokenizer_dir, encoder_outputs):
    config, encoder, *_ = encoder_outputs
    params = {"encoder": encoder, "classifier": {"kernel": np.zeros((48, 2), np.float32),
                                                 "bias": np.zeros(2, np.float32)}}
    for heads, phrase in [
            ({"head": "sequence_classification", "num_labels": 3, "labels": ["a", "b", "c"]},
             "says 3 outputs"),
            ({"head": "multiple_choice", "num_labels": 2}, "'multiple_choice'")]:
        workdir = save_workdir(str(tmp_path / heads["head"]), params, config,
                               task="finetune_x", heads=heads, tokenizer_dir=tokenizer_dir)
        code, _, err = run_export(capsys, "--workdir", workdir, "--format", "hf", "--output",
                                  str(tmp_path / "out"))
        assert_one_line_error(code, err, phrase)
        assert not (tmp_path / "out").exists()


def test_an_existing_output_is_kept_unless_overwrite_and_a_failed_write_keeps_it(
        tmp_path, capsys, small_workdir, monkeypatch):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "keep.txt").write_text("mine")
    code, _, err = run_export(capsys, "--workdir", small_workdir, "--format", "hf",
                              "--output", str(mine), "--overwrite")
    assert_one_line_error(code, err, "is not a model export", "--overwrite replaces only")
    assert (mine / "keep.txt").read_text() == "mine" and len(os.listdir(mine)) == 1

    out = tmp_path / "out"
    code, _, err = run_export(capsys, "--workdir", small_workdir, "--format", "params",
                              "--output", str(out))
    assert code == 0, err
    before = snapshot(out)
    code, _, err = run_export(capsys, "--workdir", small_workdir, "--format", "hf",
                              "--output", str(out))
    assert_one_line_error(code, err, "already exists", "--overwrite")
    assert snapshot(out) == before

    code, _, err = run_export(capsys, "--workdir", small_workdir, "--format", "hf",
                              "--output", small_workdir, "--overwrite")
    assert_one_line_error(code, err, "would replace the input")
    assert loading.kind_of(small_workdir) == loading.WORKDIR

    # A disk that fills up half way through: one line, the old export stays whole, no debris.
    def disk_full(*args, **kwargs):
        raise OSError(28, "No space left on device")

    with monkeypatch.context() as patch:
        patch.setattr(hf_files, "write_tokenizer", disk_full)
        with pytest.raises(UserError, match="no space left on the device writing"):
            export.export(small_workdir, "hf", str(out), overwrite=True)
    assert snapshot(out) == before and not leftovers(tmp_path)

    code, _, err = run_export(capsys, "--workdir", small_workdir, "--format", "hf",
                              "--output", str(out), "--overwrite")
    assert code == 0, err
    assert not (out / "bertjax.json").exists() and (out / "model.safetensors").exists()
    assert not leftovers(tmp_path)


@pytest.mark.slow
def test_a_sentencepiece_vocabulary_is_shipped_beside_the_model_with_a_warning(
        tmp_path, capsys, small_workdir, demo_articles):
    from bertjax.data.tokenizer_training import train_sentencepiece

    spm_dir = str(tmp_path / "spm")
    sentences = [s for d in demo_articles[:20] for s in d]
    train_sentencepiece(sentences, vocab_size=300).save(spm_dir)
    out = str(tmp_path / "hf")
    code, _, err = run_export(capsys, "--workdir", small_workdir, "--format", "hf", "--output",
                              out, "--tokenizer", spm_dir)
    assert code == 0, err
    assert "sentencepiece vocabularies have no BERT tokenizer in transformers" in err
    assert not os.path.exists(os.path.join(out, "vocab.txt"))
    assert load_tokenizer(os.path.join(out, hf_files.BERTJAX_TOKENIZER)).kind == "sentencepiece"
    BertForPreTraining.from_pretrained(out)  # the model itself still loads
