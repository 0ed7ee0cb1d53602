"""Hugging Face RoBERTa / XLM-RoBERTa <-> bertjax: random RobertaForMaskedLM and
XLMRobertaForMaskedLM models (byte-level BPE tokenizer.json, padding) converted by `python -m
bertjax.convert` compute transformers' hidden states and MLM scores; `python -m bertjax.export`
gives back a directory of the same model type and class that loads into transformers with every
weight, bit-identical, and computes the same scores; `bertjax.load` embeds text with the carried
tokenizer as transformers does.
"""

import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from tokenizers import Tokenizer, models, pre_tokenizers, processors
from transformers import (AutoModelForMaskedLM, AutoTokenizer, PreTrainedTokenizerFast,
                          RobertaConfig, RobertaForMaskedLM,
                          RobertaModel, XLMRobertaConfig, XLMRobertaForMaskedLM,
                          XLMRobertaForSequenceClassification)

import bertjax
from bertjax.cli import convert, export
from bertjax.core.errors import UserError
from bertjax.inference import loading
from bertjax.interop import hf_files, hf_models
from bertjax.model.encoder import Encoder
from bertjax.model.heads import BertForPretraining
from cli_checks import run_cli
from pretrain_runs import REPO
from pretrain_runs import run_cli as run_module

pytestmark = pytest.mark.slow

TOL = dict(atol=1e-5, rtol=1e-5)
SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # fairseq's order: <s> 0, <pad> 1, </s> 2
PAD = 1
TEXTS = ["The cat sat on the mat.", "Two men play chess in a park, after the rain.", "Paris!"]
CLASSES = {"roberta": (RobertaConfig, RobertaForMaskedLM, "RobertaForMaskedLM"),
           "xlm-roberta": (XLMRobertaConfig, XLMRobertaForMaskedLM, "XLMRobertaForMaskedLM")}
SIZES = dict(hidden_size=48, num_attention_heads=3, intermediate_size=80, num_hidden_layers=2,
             max_position_embeddings=66, type_vocab_size=1, pad_token_id=PAD, bos_token_id=0,
             eos_token_id=2, attn_implementation="eager")


def byte_level_tokenizer() -> Tokenizer:
    """RoBERTa's tokenizer shape without merges: specials, the 256 byte symbols, <mask> last."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {token: i for i, token in enumerate([*SPECIALS, *sorted(alphabet), "<mask>"])}
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[], unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.post_processor = processors.RobertaProcessing(("</s>", 2), ("<s>", 0))
    tok.add_special_tokens([*SPECIALS, "<mask>"])
    return tok


def randomize(model: torch.nn.Module, seed: int) -> None:
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith(("LayerNorm.weight", "layer_norm.weight")):
                param.uniform_(0.5, 1.5)
            else:
                param.normal_(0.0, 0.1)


def save_hf(directory, model, tokenizer: Tokenizer) -> str:
    model.save_pretrained(directory)
    tokenizer.save(os.path.join(directory, "tokenizer.json"))
    return str(directory)


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory):
    """{model_type: (the random masked LM, its directory)}."""
    root = tmp_path_factory.mktemp("roberta")
    tokenizer = byte_level_tokenizer()
    out = {}
    for seed, (model_type, (config_class, model_class, _)) in enumerate(CLASSES.items()):
        config = config_class(vocab_size=tokenizer.get_vocab_size(), **SIZES)
        model = model_class(config).eval()
        randomize(model, seed)
        out[model_type] = model, save_hf(root / model_type, model, tokenizer)
    return out


@pytest.fixture(scope="module")
def converted(hf_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("converted")
    for model_type, (_, directory) in hf_dirs.items():
        convert.main(["--from-hf", directory, "--output", str(root / model_type)])
    return {model_type: str(root / model_type) for model_type in hf_dirs}


def padded_batch(seed: int):
    """<s> tokens </s>, rows of different lengths padded with <pad>: positions must skip it."""
    rng = np.random.default_rng(seed)
    lengths = (20, 13, 7)
    ids = np.full((len(lengths), max(lengths)), PAD, np.int32)
    for row, length in enumerate(lengths):
        ids[row, :length] = rng.integers(3, 259, length)
        ids[row, 0], ids[row, length - 1] = 0, 2
    return ids, (ids != PAD).astype(np.int32)


def hf_outputs(model, ids, mask):
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids, dtype=torch.long),
                    attention_mask=torch.tensor(mask), output_hidden_states=True)
    return np.stack([h.numpy() for h in out.hidden_states]), out.logits.numpy()


def our_outputs(params, config, ids, mask):
    zeros = np.zeros_like(ids)
    batch = {"input_ids": ids, "segment_ids": zeros, "input_mask": mask,
             "masked_positions": np.broadcast_to(np.arange(ids.shape[1], dtype=np.int32),
                                                 ids.shape)}
    encoder = Encoder(config, all_layers=True)
    layers = jax.jit(lambda p: encoder.apply({"params": p}, ids, zeros, mask).layers)(
        params["encoder"])
    heads = BertForPretraining(config, nsp="nsp" in params)
    logits = jax.jit(lambda p, b: heads.apply({"params": p}, b))(
        params, {k: jnp.asarray(v) for k, v in batch.items()})["mlm_logits"]
    return np.asarray(layers), np.asarray(logits)


def source_tokenizer(directory):
    """The source's tokenizer.json as transformers runs it (the directory has no
    tokenizer_config.json naming a class, and XLM-R's own class is a Unigram one)."""
    return PreTrainedTokenizerFast(tokenizer_file=os.path.join(directory, "tokenizer.json"))


def weights(directory):
    return load_file(os.path.join(directory, hf_files.SAFETENSORS))


@pytest.mark.parametrize("model_type", list(CLASSES))
def test_a_converted_model_computes_transformers_states_and_scores(hf_dirs, converted,
                                                                   model_type):
    hf, _ = hf_dirs[model_type]
    bundle = loading.load(converted[model_type])
    config = bundle.encoder
    assert config.positions_from_padding and config.pad_token_id == PAD
    assert (config.type_vocab_size, config.max_sequence_length) == (1, 64)
    assert bundle.heads["hf_model_type"] == model_type
    ids, mask = padded_batch(seed=len(model_type))
    states, logits = our_outputs(bundle.params, config, ids, mask)
    hf_states, hf_logits = hf_outputs(hf, ids, mask)
    print(f"max |ours - transformers|: states {np.abs(states - hf_states).max():.2e}, "
          f"MLM logits {np.abs(logits - hf_logits).max():.2e}")
    np.testing.assert_allclose(states, hf_states, **TOL)
    np.testing.assert_allclose(logits, hf_logits, **TOL)
    assert np.abs(hf_logits).max() > 1.0  # not a comparison of near-zero values


def test_the_cli_names_what_roberta_lacks(hf_dirs, tmp_path, capsys):
    code, stdout, err = run_cli(convert, ["--from-hf", hf_dirs["roberta"][1], "--output",
                                          str(tmp_path / "out")], capsys)
    assert code == 0 and "2 layers, hidden 48, 3 heads, vocabulary 261" in stdout, err
    assert "initialized fresh" in err and "roberta.pooler" in err and "NSP" in err
    assert "lm_head" not in err and "not imported" not in err


@pytest.mark.parametrize("model_type", list(CLASSES))
def test_export_gives_back_the_same_model_bit_for_bit(hf_dirs, converted, tmp_path, capsys,
                                                      model_type):
    hf, source = hf_dirs[model_type]
    out = str(tmp_path / "hf")
    code, stdout, err = run_cli(export, ["--workdir", converted[model_type], "--format", "hf",
                                         "--output", out], capsys)
    assert code == 0 and "wrote the Hugging Face export" in stdout, err
    assert "the pooler, the NSP head" in err
    ours, theirs = weights(out), weights(source)
    assert sorted(ours) == sorted(theirs)
    for name in theirs:
        assert ours[name].dtype == theirs[name].dtype, name
        assert np.array_equal(ours[name].view(np.uint32), theirs[name].view(np.uint32)), name
    with open(os.path.join(out, hf_files.CONFIG)) as f:
        config = json.load(f)
    _, model_class, architecture = CLASSES[model_type]
    assert (config["model_type"], config["architectures"]) == (model_type, [architecture])
    reloaded, info = AutoModelForMaskedLM.from_pretrained(out, output_loading_info=True,
                                                          attn_implementation="eager")
    assert type(reloaded) is model_class and not any(info.values()), info
    for name, tensor in hf.state_dict().items():
        assert torch.equal(reloaded.state_dict()[name], tensor), name
    ids, mask = padded_batch(seed=7)
    for got, want in zip(hf_outputs(reloaded.eval(), ids, mask), hf_outputs(hf, ids, mask)):
        np.testing.assert_array_equal(got, want)
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer(TEXTS)["input_ids"] == source_tokenizer(source)(TEXTS)["input_ids"]


def test_the_api_embeds_text_as_transformers_does(hf_dirs, converted):
    hf, source = hf_dirs["xlm-roberta"]
    model = bertjax.load(converted["xlm-roberta"])
    encoded = model.encode(TEXTS, layers=-1)
    expected = source_tokenizer(source)(TEXTS)["input_ids"]
    assert [list(e.ids) for e in encoded] == expected  # <s> ... </s>, the file's own ids
    length = max(len(ids) for ids in expected)
    ids = np.full((len(TEXTS), length), PAD, np.int64)
    for row, row_ids in enumerate(expected):
        ids[row, :len(row_ids)] = row_ids
    states, _ = hf_outputs(hf, ids, (ids != PAD).astype(np.int64))
    for row, e in enumerate(encoded):
        np.testing.assert_allclose(e.hidden[0], states[-1, row, :len(e.ids)], **TOL)


def test_a_roberta_model_keeps_its_pooler(tmp_path):
    """A bare RobertaModel (pooler, no MLM head) goes out as RobertaModel with every weight."""
    config = RobertaConfig(vocab_size=261, **SIZES)
    hf = RobertaModel(config).eval()
    randomize(hf, seed=5)
    source = save_hf(tmp_path / "hf", hf, byte_level_tokenizer())
    convert.main(["--from-hf", source, "--output", str(tmp_path / "ours"), "--no-scan-layers"])
    bundle = loading.load(str(tmp_path / "ours"))
    encoder_only = {"encoder": bundle.params["encoder"]}  # exported as the bare model
    exported = hf_models.to_hf(encoder_only, bundle.encoder, bundle.heads)
    assert exported.config["architectures"] == ["RobertaModel"]
    theirs = weights(source)
    assert sorted(exported.state_dict) == sorted(theirs)
    for name, value in theirs.items():
        assert np.array_equal(exported.state_dict[name], value), name


def test_given_positions_take_the_same_offset(converted):
    """Packed rows give positions restarting at 0: each sequence is numbered from
    pad_token_id + 1 as it would be alone; a sequence longer than the offset table allows is
    refused by its length, not by max_position_embeddings."""
    bundle = loading.load(converted["roberta"])
    config, params = bundle.encoder, bundle.params["encoder"]
    ids, mask = padded_batch(seed=3)
    ids, mask = ids[:1], mask[:1]  # the unpadded row: positions 0..L-1 are its own
    zeros = np.zeros_like(ids)
    encoder = Encoder(config)
    alone = encoder.apply({"params": params}, ids, zeros, mask).sequence
    given = encoder.apply({"params": params}, ids, zeros, mask,
                          positions=np.arange(ids.shape[1])[None]).sequence
    np.testing.assert_array_equal(np.asarray(alone), np.asarray(given))
    too_long = np.full((1, config.max_sequence_length + 1), 5, np.int32)
    with pytest.raises(UserError, match="exceeds the 64 positions"):
        encoder.apply({"params": params}, too_long, 0 * too_long, 1 + 0 * too_long)


def _corpus_text(path) -> str:
    """60 short documents of 5 sentences drawn from a small word list."""
    rng = np.random.default_rng(0)
    words = ("the cat sat on a mat and dogs run in parks while rain falls over green hills "
             "near old towns").split()
    with open(path, "w") as f:
        for _ in range(60):
            for _ in range(5):
                f.write(" ".join(rng.choice(words, 12)).capitalize() + ".\n")
            f.write("\n")
    return str(path)


def _roberta_run(workdir, text, *settings):
    done = run_module("bertjax.main", f"--config={REPO}/configs/roberta.py",
                      f"--workdir={workdir}", f"--config.data.input={text}",
                      "--config.train.steps=2", "--config.train.batch_size=4",
                      "--config.schedule.long_seq_len=32",
                      "--config.schedule.long_max_predictions=5",
                      "--config.optimizer.warmup_steps=0", *settings)
    assert done.returncode == 0, done.stderr[-3000:]


def test_continued_pretraining_keeps_the_imported_mlm_head(hf_dirs, converted, tmp_path):
    """"Continue pretraining roberta-base on my domain": the run starts from every imported
    weight, the MLM head included, in the source's layout. With a learning rate too small to
    move a float32 weight, its export is the source, bit for bit."""
    workdir = str(tmp_path / "run")
    _roberta_run(workdir, _corpus_text(tmp_path / "text.txt"),
                 f"--config.init_checkpoint={converted['roberta']}",
                 "--config.model.preset=from_checkpoint", "--config.optimizer.learning_rate=1e-30")
    out = str(tmp_path / "hf")
    done = run_module("bertjax.export", "--workdir", workdir, "--format", "hf", "--output", out)
    assert done.returncode == 0, done.stderr[-3000:]
    ours, theirs = weights(out), weights(hf_dirs["roberta"][1])
    assert sorted(ours) == sorted(theirs)
    for name in theirs:
        assert np.array_equal(ours[name], theirs[name]), name


def test_a_roberta_layout_run_exports_as_roberta(tmp_path):
    """A RoBERTa-objective run with RoBERTa's positions (model.positions_from_padding) and its own
    WordPiece vocabulary loads in RobertaForMaskedLM with every weight and computes its logits."""
    workdir = str(tmp_path / "run")
    _roberta_run(workdir, _corpus_text(tmp_path / "text.txt"), "--config.model.preset=tiny",
                 "--config.model.positions_from_padding=true", "--config.data.vocab_size=300")
    out = str(tmp_path / "hf")
    done = run_module("bertjax.export", "--workdir", workdir, "--format", "hf", "--output", out)
    assert done.returncode == 0, done.stderr[-3000:]
    bundle = loading.load(workdir)
    special = bundle.tokenizer().special
    reloaded, info = AutoModelForMaskedLM.from_pretrained(out, output_loading_info=True,
                                                          attn_implementation="eager")
    assert type(reloaded) is RobertaForMaskedLM and not any(info.values()), info
    config = reloaded.config
    assert (config.pad_token_id, config.bos_token_id, config.eos_token_id) == (
        special.pad, special.cls, special.sep)
    rng = np.random.default_rng(1)
    lengths = (20, 13, 7)
    ids = np.full((3, 20), special.pad, np.int32)
    for row, length in enumerate(lengths):
        ids[row, :length] = rng.integers(5, bundle.encoder.vocab_size, length)
    mask = (ids != special.pad).astype(np.int32)
    _, logits = our_outputs(bundle.params, bundle.encoder, ids, mask)
    _, hf_logits = hf_outputs(reloaded.eval(), ids, mask)
    real = mask.astype(bool)  # padding's positions differ by design (pad_token_id's row)
    np.testing.assert_allclose(logits[real], hf_logits[real], atol=1e-4, rtol=1e-4)


def test_a_fine_tuned_xlm_roberta_exports_as_its_task_class(hf_dirs, converted, tmp_path):
    """Fine-tune an imported XLM-R on the packaged movie reviews, export: transformers'
    XLMRobertaForSequenceClassification loads every weight and scores as bertjax does."""
    workdir, out = str(tmp_path / "run"), str(tmp_path / "hf")
    done = run_module("bertjax.main", f"--config={REPO}/configs/finetune_sentiment.py",
                      f"--workdir={workdir}", f"--config.init_checkpoint={converted['xlm-roberta']}",
                      "--config.model.preset=from_checkpoint", "--config.data.max_seq_len=32",
                      "--config.data.max_train_examples=64", "--config.data.max_eval_examples=16",
                      "--config.train.epochs=1", "--config.train.batch_size=16")
    assert done.returncode == 0, done.stderr[-3000:]
    done = run_module("bertjax.export", "--workdir", workdir, "--format", "hf", "--output", out)
    assert done.returncode == 0, done.stderr[-3000:]
    hf, info = XLMRobertaForSequenceClassification.from_pretrained(
        out, output_loading_info=True, attn_implementation="eager")
    assert not any(info.values()), info
    model = loading.load(workdir)
    ids, mask = padded_batch(5)
    with torch.no_grad():
        theirs = hf.eval()(input_ids=torch.tensor(ids, dtype=torch.long),
                           attention_mask=torch.tensor(mask)).logits.numpy()
    head = model.params["classifier"]
    encoded = jax.jit(Encoder(model.encoder).apply)({"params": model.params["encoder"]}, ids,
                                                    0 * ids, mask)
    ours = np.asarray(encoded.pooled) @ np.asarray(head["kernel"]) + np.asarray(head["bias"])
    np.testing.assert_allclose(ours, theirs, atol=1e-4, rtol=1e-4)
