"""`python -m bertjax.convert --from-hf`: Hugging Face directories (safetensors, pytorch_model.bin,
names with and without `bert.`, the real pretrained MiniLM) into params exports that reproduce
transformers and start pretraining runs; bad input refused in one line with nothing written.

The name mapping itself is tested in test_hf_parity.py; these tests go through the files and CLI.
"""

import dataclasses
import hashlib
import json
import os
import subprocess
import shutil
import sys

import jax
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from transformers import AutoTokenizer, BertConfig, BertForPreTraining, BertModel

from bertjax.core.errors import UserError
from bertjax.inference import loading
from bertjax.cli import convert
from bertjax.cli import main
from bertjax.data.tokenizer import load_tokenizer
from bertjax.interop import hf_bert_config, hf_files, hf_layout, params_dir
from bertjax.model import layout
from bertjax.model.encoder import Encoder
from cli_checks import assert_one_line_error, leftovers, run_cli, snapshot
from hf_reference import PAIRS, TOL, randomize, run_hf, run_ours, save_hf_dir, text_batch
from pretrain_runs import CHILD_XLA_FLAGS

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
BUFFERS = ("bert.embeddings.position_ids", "bert.embeddings.token_type_ids")


def random_bert(hidden, heads, intermediate, layers, *, cls=BertForPreTraining, vocab=30522,
                max_positions=64):
    config = BertConfig(vocab_size=vocab, hidden_size=hidden, num_attention_heads=heads,
                        intermediate_size=intermediate, num_hidden_layers=layers,
                        max_position_embeddings=max_positions, attn_implementation="eager")
    model = cls(config).eval()
    randomize(model, seed=hidden + layers)
    return model


def hf_weights(model):
    return {k: v.numpy() for k, v in model.state_dict().items() if not k.startswith(BUFFERS)}


def assert_bit_identical(a, b):
    assert a.keys() == b.keys()
    for name in a:
        assert a[name].dtype == b[name].dtype and a[name].shape == b[name].shape, name
        assert np.array_equal(a[name].view(np.uint32), b[name].view(np.uint32)), name


SHAPES = [  # hidden, heads, intermediate, layers, token types
    (60, 5, 150, 2, True),
    (63, 7, 130, 1, False),
]


@pytest.mark.parametrize("hidden,heads,intermediate,layers,token_types", SHAPES)
def test_a_converted_safetensors_checkpoint_round_trips_and_computes_like_transformers(
        tmp_path, capsys, bert_vocab_path, hidden, heads, intermediate, layers, token_types):
    hf = random_bert(hidden, heads, intermediate, layers)
    source = save_hf_dir(tmp_path / "hf", hf, bert_vocab_path)
    out = str(tmp_path / "converted")
    code, stdout, err = run_cli(convert, ["--from-hf", source, "--output", out], capsys)
    assert code == 0, err
    assert f"{layers} layers, hidden {hidden}, {heads} heads" in stdout
    assert "initialized fresh" not in err  # BertForPreTraining has every part

    bundle = loading.load(out)
    assert bundle.encoder == hf_bert_config.encoder_config_from_hf(hf.config.to_dict(), scan_layers=True)
    assert_bit_identical(hf_layout.to_hf_state_dict(bundle.params, bundle.encoder), hf_weights(hf))

    batch = text_batch(bert_vocab_path, pairs=token_types, seed=layers)
    ours, sequence, pooled = run_ours(bundle.params, bundle.encoder, batch)
    mlm, nsp, hf_sequence, hf_pooled = run_hf(hf, batch, token_types)
    np.testing.assert_allclose(sequence, hf_sequence, **TOL)
    np.testing.assert_allclose(pooled, hf_pooled, **TOL)
    np.testing.assert_allclose(ours["mlm_logits"], mlm, **TOL)
    np.testing.assert_allclose(ours["nsp_logits"], nsp, **TOL)


def test_pytorch_model_bin_is_read_with_weights_only_and_gives_the_same_params(
        tmp_path, capsys, bert_vocab_path):
    hf = random_bert(60, 3, 100, 1)
    source = save_hf_dir(tmp_path / "hf", hf, bert_vocab_path, lowercase=False)
    os.remove(os.path.join(source, "model.safetensors"))
    torch.save(hf.state_dict(), os.path.join(source, "pytorch_model.bin"))
    code, _, err = run_cli(convert, ["--from-hf", source, "--output", str(tmp_path / "out"),
                                     "--no-scan-layers"], capsys)
    assert code == 0, err
    bundle = loading.load(str(tmp_path / "out"))
    assert "layer_0" in bundle.params["encoder"]
    # A cased tokenizer (do_lower_case false) stays cased: "Paris" is not "paris".
    tokenizer = load_tokenizer(bundle.tokenizer_dir)
    assert not tokenizer.lowercase
    assert tokenizer.encode("Paris").tolist() != tokenizer.encode("paris").tolist()
    assert_bit_identical(hf_layout.to_hf_state_dict(bundle.params, bundle.encoder), hf_weights(hf))


def test_sharded_safetensors_are_read_through_their_index(tmp_path, capsys, small_hf_dir):
    hf = BertForPreTraining.from_pretrained(small_hf_dir)
    sharded = str(tmp_path / "sharded")
    hf.save_pretrained(sharded, max_shard_size="1MB")
    shutil.copy(os.path.join(small_hf_dir, "vocab.txt"), sharded)
    assert os.path.exists(os.path.join(sharded, "model.safetensors.index.json"))
    assert not os.path.exists(os.path.join(sharded, "model.safetensors"))
    code, _, err = run_cli(convert, ["--from-hf", sharded, "--output", str(tmp_path / "out")],
                           capsys)
    assert code == 0, err
    bundle = loading.load(str(tmp_path / "out"))
    assert_bit_identical(hf_layout.to_hf_state_dict(bundle.params, bundle.encoder), hf_weights(hf))


class RunsCode:
    """A pickle that would create a directory when unpickled without weights_only."""

    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (os.makedirs, (self.path,))


def test_a_pickle_that_runs_code_is_refused_not_executed(tmp_path, capsys, bert_vocab_path):
    source = save_hf_dir(tmp_path / "hf", random_bert(60, 3, 100, 1), bert_vocab_path)
    os.remove(os.path.join(source, "model.safetensors"))
    marker = str(tmp_path / "code-ran")
    torch.save({"bert.embeddings.word_embeddings.weight": RunsCode(marker)},
               os.path.join(source, "pytorch_model.bin"))
    code, _, err = run_cli(convert, ["--from-hf", source, "--output", str(tmp_path / "out")],
                           capsys)
    assert_one_line_error(code, err, "pytorch_model.bin", "not plain weights")
    assert not os.path.exists(marker) and not os.path.exists(tmp_path / "out")


def test_pytorch_model_bin_without_torch_says_what_is_missing(tmp_path, capsys, monkeypatch):
    (tmp_path / "hf").mkdir()
    (tmp_path / "hf" / "config.json").write_text(json.dumps({"model_type": "bert"}))
    (tmp_path / "hf" / "pytorch_model.bin").write_bytes(b"not read")
    monkeypatch.setitem(sys.modules, "torch", None)  # import torch fails
    code, _, err = run_cli(convert, ["--from-hf", str(tmp_path / "hf"), "--output",
                                     str(tmp_path / "out")], capsys)
    assert_one_line_error(code, err, "needs the hf extra", "pip install 'bertjax[hf]'")


def test_real_minilm_without_heads_reproduces_transformers_through_the_cli(
        tmp_path, capsys, minilm_dir):
    out = str(tmp_path / "minilm")
    code, _, err = run_cli(convert, ["--from-hf", minilm_dir, "--output", out], capsys)
    assert code == 0, err
    # Bare BertModel names (no `bert.` prefix), no heads: the CLI says what it initialized.
    assert ("bertjax: note: initialized fresh" in err and "the MLM head (cls.predictions)" in err
            and "the NSP head (cls.seq_relationship)" in err), err

    bundle = loading.load(out)
    fresh = bundle.params  # the heads carry our initialization
    assert np.all(fresh["mlm"]["bias"] == 0) and np.all(fresh["mlm"]["norm"]["scale"] == 1)
    assert 0.015 < fresh["mlm"]["transform"]["kernel"].std() < 0.025  # normal(0.02)
    minilm_weights = load_file(os.path.join(minilm_dir, "model.safetensors"))
    assert np.array_equal(bundle.params["encoder"]["embeddings"]["word_embeddings"],
                          minilm_weights["embeddings.word_embeddings.weight"])

    # The tokenizer round trip: same ids as transformers' own tokenizer of the checkpoint.
    tokenizer = load_tokenizer(bundle.tokenizer_dir)
    reference = AutoTokenizer.from_pretrained(minilm_dir)
    assert tokenizer.lowercase
    batch = {k: [] for k in ("input_ids", "segment_ids", "input_mask")}
    sp = tokenizer.special
    for first, second in PAIRS:
        a, b = tokenizer.encode(first).tolist(), tokenizer.encode(second).tolist()
        want = reference(first, second)
        assert [sp.cls, *a, sp.sep, *b, sp.sep] == want["input_ids"]
        batch["input_ids"].append(want["input_ids"])
        batch["segment_ids"].append(want["token_type_ids"])
    length = max(map(len, batch["input_ids"])) + 2
    padded = {k: np.array([row + [0] * (length - len(row)) for row in rows], np.int32)
              for k, rows in batch.items() if rows}
    padded["input_mask"] = (np.arange(length)[None] < np.array(
        [[len(r)] for r in batch["input_ids"]])).astype(np.int32)

    hf = BertModel.from_pretrained(minilm_dir, dtype=torch.float32,
                                   attn_implementation="eager").eval()
    with torch.no_grad():
        want = hf(input_ids=torch.from_numpy(padded["input_ids"]).long(),
                  attention_mask=torch.from_numpy(padded["input_mask"]).long(),
                  token_type_ids=torch.from_numpy(padded["segment_ids"]).long())
    got = jax.jit(Encoder(bundle.encoder).apply)(
        {"params": bundle.params["encoder"]}, padded["input_ids"], padded["segment_ids"],
        padded["input_mask"])
    np.testing.assert_allclose(got.sequence, want.last_hidden_state.numpy(), **TOL)
    np.testing.assert_allclose(got.pooled, want.pooler_output.numpy(), **TOL)


def tiny_pretrain_args(workdir, corpus_dir, **overrides):
    settings = {"data.prepared": corpus_dir, "data.workers": 0, "train.steps": 2,
                "train.batch_size": 8, "schedule.short_seq_len": 32,
                "schedule.short_max_predictions": 5, "schedule.long_fraction": 0.0,
                "train.log_every": 1, "train.checkpoint_every": 2, "train.eval_every": 0,
                "optimizer.warmup_steps": 1, "model.preset": "from_checkpoint"}
    settings.update(overrides)
    return ["bertjax.cli.main", f"--config={REPO}/configs/tiny.py", f"--workdir={workdir}"] + [
        f"--config.{k}={v}" for k, v in settings.items()]


def run_main_in_child(args):
    """The job in a child process on one CPU device with the least XLA optimization: compiling,
    not running, dominates a two-step run."""
    env = {**os.environ, "XLA_FLAGS": CHILD_XLA_FLAGS}
    return subprocess.run([sys.executable, "-m", "bertjax.main", *args[1:]], env=env,
                                cwd=REPO, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_converted_model_starts_pretraining_with_its_own_shape_and_exports_again(
        tmp_path, capsys, small_corpus_dir):
    # A model over the small corpus's own vocabulary, of a shape no preset has.
    vocab = os.path.join(small_corpus_dir, "tokenizer", "vocab.txt")
    with open(vocab) as f:
        vocab_size = sum(1 for _ in f)
    source = save_hf_dir(tmp_path / "hf", random_bert(48, 3, 72, 3, vocab=vocab_size), vocab)
    converted = str(tmp_path / "converted")
    code, _, err = run_cli(convert, ["--from-hf", source, "--output", converted], capsys)
    assert code == 0, err

    workdir = str(tmp_path / "run")
    result = run_main_in_child(tiny_pretrain_args(workdir, small_corpus_dir,
                                                  init_checkpoint=converted))
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"loaded 30 parameters from {converted}" in result.stderr  # all of them
    with open(os.path.join(workdir, "run.json")) as f:
        encoder = json.load(f)["encoder"]
    assert (encoder["num_layers"], encoder["hidden_size"], encoder["num_heads"],
            encoder["intermediate_size"], encoder["max_position_embeddings"],
            encoder["vocab_size"]) == (3, 48, 3, 72, 64, vocab_size)
    # Two steps trained the converted model: its weights moved, a little.
    trained = loading.load(workdir).params
    start = loading.load(converted).params
    delta = np.abs(trained["encoder"]["embeddings"]["word_embeddings"] -
                   start["encoder"]["embeddings"]["word_embeddings"]).max()
    assert 0 < delta < 0.1

    # ... and the run exports back to transformers with the trained weights.
    from bertjax.cli import export

    out = str(tmp_path / "exported")
    code, _, err = run_cli(export, ["--workdir", workdir, "--format", "hf", "--output", out],
                           capsys)
    assert code == 0, err
    hf = BertForPreTraining.from_pretrained(out)
    assert_bit_identical(hf_weights(hf), hf_layout.to_hf_state_dict(trained, bundle_model(out)))

    # A size that disagrees with the checkpoint is refused by name.
    other = str(tmp_path / "other")
    args = tiny_pretrain_args(other, small_corpus_dir, init_checkpoint=converted,
                              **{"model.hidden_size": 64})
    capsys.readouterr()
    assert main.main(args) == 2
    err = capsys.readouterr().err
    assert "model.hidden_size=64 disagrees with the init checkpoint's 48" in err
    assert err.count("\n") == 1 and not os.path.exists(other)


def bundle_model(hf_dir):
    return hf_bert_config.encoder_config_from_hf(hf_files.read_config(hf_dir), scan_layers=True)


def test_a_corpus_of_another_vocabulary_is_refused_with_from_checkpoint(
        tmp_path, capsys, small_corpus_dir, minilm_dir):
    # The record alone (MiniLM's shape and 30,522-token vocabulary) is enough to refuse the
    # corpus prepared with a 1,000-token vocabulary, before any weights are read.
    converted = tmp_path / "minilm"
    load_tokenizer(minilm_dir).save(str(converted / "tokenizer"))
    config = hf_bert_config.encoder_config_from_hf(hf_files.read_config(minilm_dir))
    (converted / params_dir.INFO_FILE).write_text(json.dumps(
        {"format": params_dir.FORMAT, "model": dataclasses.asdict(config), "heads": {}}))
    workdir = str(tmp_path / "run")
    assert main.main(tiny_pretrain_args(workdir, small_corpus_dir,
                                        init_checkpoint=str(converted))) == 2
    err = capsys.readouterr().err
    assert "another vocabulary than the init checkpoint's" in err and err.count("\n") == 1


@pytest.fixture(scope="module")
def small_hf_dir(tmp_path_factory, bert_vocab_path):
    directory = tmp_path_factory.mktemp("small_hf") / "hf"
    return save_hf_dir(directory, random_bert(30, 3, 44, 2, vocab=30522), bert_vocab_path)


def broken_copy(source, tmp_path, edit):
    target = str(tmp_path / "broken")
    shutil.copytree(source, target)
    edit(target)
    return target


def edit_config(**changes):
    def edit(directory):
        path = os.path.join(directory, "config.json")
        with open(path) as f:
            config = json.load(f)
        config.update(changes)
        with open(path, "w") as f:
            json.dump(config, f)
    return edit


def truncate_weights(directory):
    path = os.path.join(directory, "model.safetensors")
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:len(data) // 2])


def empty_dir(directory):
    for name in os.listdir(directory):
        os.remove(os.path.join(directory, name))
    with open(os.path.join(directory, "notes.txt"), "w") as f:
        f.write("not a model")


@pytest.mark.parametrize("edit, phrases", [
    (empty_dir, ["is not a Hugging Face BERT checkpoint", "no config.json"]),
    (lambda d: os.remove(os.path.join(d, "model.safetensors")), ["has no weights"]),
    (truncate_weights, ["model.safetensors", "truncated"]),
    (edit_config(model_type="gpt2", architectures=["GPT2LMHeadModel"]),
     ["unsupported model_type 'gpt2'", "reads BERT"]),
    # The model type names the family: not "architecture ModernBertForMaskedLM" of a BERT list.
    (edit_config(model_type="gpt2", architectures=["ModernBertForMaskedLM"]),
     ["unsupported model_type 'gpt2'", "ModernBERT ('modernbert')"]),
    (edit_config(architectures=["RobertaForMaskedLM"]),
     ["unsupported architecture RobertaForMaskedLM"]),
    (edit_config(architectures=None, model_type="t5"), ["unsupported model_type 't5'"]),
    (edit_config(hidden_size=60), ["has shape", "does not fit the model config"]),
    (edit_config(num_hidden_layers=3), ["lack", "bert.encoder.layer.2"]),
    (edit_config(num_hidden_layers=1), ["bert.encoder.layer.1", "config does not call for"]),
    (edit_config(vocab_size=20000), ["word_embeddings.weight has shape (30522, 30)"]),
])
def test_bad_input_is_one_line_exit_2_and_writes_nothing(
        small_hf_dir, tmp_path, capsys, edit, phrases):
    source = broken_copy(small_hf_dir, tmp_path, edit)
    out = tmp_path / "out"
    code, _, err = run_cli(convert, ["--from-hf", source, "--output", str(out)], capsys)
    assert_one_line_error(code, err, *phrases)
    assert not out.exists() and not leftovers(tmp_path)


def test_an_existing_output_is_kept_unless_overwrite(small_hf_dir, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    before = snapshot(out)
    code, _, err = run_cli(convert, ["--from-hf", small_hf_dir, "--output", str(out)], capsys)
    assert_one_line_error(code, err, "already exists", "--overwrite")
    assert snapshot(out) == before

    # The input itself is never the thing replaced.
    code, _, err = run_cli(convert, ["--from-hf", small_hf_dir, "--output", small_hf_dir,
                                     "--overwrite"], capsys)
    assert_one_line_error(code, err, "would replace the input")
    assert os.path.exists(os.path.join(small_hf_dir, "model.safetensors"))

    # --overwrite replaces a model export only, never a directory of other things.
    code, _, err = run_cli(convert, ["--from-hf", small_hf_dir, "--output", str(out),
                                     "--overwrite"], capsys)
    assert_one_line_error(code, err, "is not a model export", "--overwrite replaces only")
    assert snapshot(out) == before
    (out / "keep.txt").unlink()
    (out / "config.json").write_text("{}")  # what a Hugging Face export holds
    code, _, err = run_cli(convert, ["--from-hf", small_hf_dir, "--output", str(out),
                                     "--overwrite"], capsys)
    assert code == 0, err
    assert not (out / "config.json").exists() and params_dir.is_params_dir(str(out))
    assert not leftovers(tmp_path)
    assert layout.is_scanned(loading.load(str(out)).params["encoder"])


def test_a_failure_while_writing_leaves_nothing_behind(small_hf_dir, tmp_path, capsys,
                                                       monkeypatch):
    from bertjax.data.tokenizer import WordPieceTokenizer

    def disk_full(self, directory):
        os.makedirs(directory)
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(WordPieceTokenizer, "save", disk_full)
    with pytest.raises(UserError, match="no space left on the device writing .*out"):
        convert.convert(small_hf_dir, str(tmp_path / "out"))
    assert os.listdir(tmp_path) == []
