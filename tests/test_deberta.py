"""DeBERTa-v2/v3 <-> bertjax: random DebertaV2ForMaskedLM models (a Unigram tokenizer.json trained
here, SentencePiece-style; padding; sequences longer than position_buckets, so log buckets are
used) converted by `python -m bertjax.convert` compute transformers' hidden states and MLM scores;
`python -m bertjax.export` gives back the same weights bit for bit; a tiny bertjax DeBERTa run
(configs/deberta.py) exports to a DebertaV2ForMaskedLM that loads with every weight and computes
bertjax's scores; settings DeBERTa cannot honour are refused before the workdir exists.
"""

import json
import os
import signal

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from tokenizers import Tokenizer, models, pre_tokenizers, processors, trainers
from transformers import DebertaV2Config, DebertaV2ForMaskedLM, DebertaV2Model

import bertjax
from bertjax.cli import convert, export
from bertjax.inference import loading
from bertjax.core.errors import UserError
from bertjax.interop import hf_files, hf_models
from bertjax.parallel.mesh import make_mesh
from bertjax.model.config import preset
from bertjax.model.encoder import Encoder
from bertjax.model.heads import BertForPretraining
import cli_in_process
from cli_checks import assert_one_line_error, run_cli
from hf_reference import randomize
from pretrain_runs import run_child, tiny_args
import test_sharded_steps as sharded
from test_pretrain import logged
from trees import flat

pytestmark = pytest.mark.slow

TOL = dict(atol=1e-4, rtol=1e-4)
SPECIALS = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]  # DeBERTa-v3's order
TEXTS = ["The cat sat on the mat.", "Two men play chess in a park, after the rain.", "Paris!"]
# position_buckets 8: distances from 4 on fall in log buckets up to 64; rows reach 40 tokens.
SIZES = dict(hidden_size=48, num_attention_heads=3, intermediate_size=80, num_hidden_layers=2,
             max_position_embeddings=128, relative_attention=True, position_buckets=8,
             max_relative_positions=64, pos_att_type="p2c|c2p", share_att_key=True,
             norm_rel_ebd="layer_norm", position_biased_input=False, layer_norm_eps=1e-7,
             pad_token_id=0, attn_implementation="eager")
VARIANTS = {"v3": dict(type_vocab_size=0, legacy=False),  # lm_predictions, no segments
            # cls.predictions, segments, and the tanh GELU (model.activation=gelu_tanh)
            "legacy": dict(type_vocab_size=2, legacy=True, hidden_act="gelu_new")}


def unigram_tokenizer(sentences) -> Tokenizer:
    tok = Tokenizer(models.Unigram())
    tok.pre_tokenizer = pre_tokenizers.Metaspace()
    trainer = trainers.UnigramTrainer(vocab_size=300, special_tokens=SPECIALS, unk_token="[UNK]")
    tok.train_from_iterator(sentences, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="[CLS] $A [SEP]", pair="[CLS] $A [SEP] $B [SEP]",
        special_tokens=[("[CLS]", 1), ("[SEP]", 2)])
    return tok


@pytest.fixture(scope="module")
def hf_dirs(tmp_path_factory, demo_articles):
    """{variant: (the random masked LM, its directory)}."""
    root = tmp_path_factory.mktemp("deberta")
    tokenizer = unigram_tokenizer(s for d in demo_articles[:10] for s in d)
    out = {}
    for seed, (variant, options) in enumerate(VARIANTS.items()):
        config = DebertaV2Config(vocab_size=tokenizer.get_vocab_size(), **SIZES, **options)
        model = DebertaV2ForMaskedLM(config).eval()
        randomize(model, seed)
        model.save_pretrained(root / variant)
        tokenizer.save(str(root / variant / "tokenizer.json"))
        out[variant] = model, str(root / variant)
    return out


@pytest.fixture(scope="module")
def converted(hf_dirs, tmp_path_factory):
    root = tmp_path_factory.mktemp("converted")
    for variant, (_, directory) in hf_dirs.items():
        convert.main(["--from-hf", directory, "--output", str(root / variant)])
    return {variant: str(root / variant) for variant in hf_dirs}


def padded_batch(seed: int, vocab: int = 300):
    """[CLS] tokens [SEP], rows of 40, 23 and 9 tokens padded with [PAD]."""
    rng = np.random.default_rng(seed)
    lengths = (40, 23, 9)
    ids = np.zeros((len(lengths), max(lengths)), np.int32)
    segments = np.zeros_like(ids)
    for row, length in enumerate(lengths):
        ids[row, :length] = rng.integers(5, vocab, length)
        ids[row, 0], ids[row, length - 1] = 1, 2
        segments[row, length // 2:length] = 1
    return ids, (ids != 0).astype(np.int32), segments


def hf_outputs(model, ids, mask, segments):
    with torch.no_grad():
        out = model(input_ids=torch.tensor(ids, dtype=torch.long),
                    attention_mask=torch.tensor(mask), output_hidden_states=True,
                    token_type_ids=torch.tensor(segments, dtype=torch.long))
    return np.stack([h.numpy() for h in out.hidden_states]), out.logits.numpy()


def our_outputs(params, config, ids, mask, segments):
    batch = {"input_ids": ids, "segment_ids": segments, "input_mask": mask,
             "masked_positions": np.broadcast_to(np.arange(ids.shape[1], dtype=np.int32),
                                                 ids.shape)}
    encoder = Encoder(config, all_layers=True)
    layers = jax.jit(lambda p: encoder.apply({"params": p}, ids, segments, mask).layers)(
        params["encoder"])
    model = BertForPretraining(config, nsp="nsp" in params)
    logits = jax.jit(lambda p, b: model.apply({"params": p}, b))(
        params, {k: jnp.asarray(v) for k, v in batch.items()})["mlm_logits"]
    return np.asarray(layers), np.asarray(logits)


def at_tokens(array, mask):
    """The values at real tokens: transformers' padding rows attend to everything, ours to the
    row's tokens; neither reaches a real token's value."""
    return array[:, mask.astype(bool)] if array.ndim == 4 else array[mask.astype(bool)]


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_a_converted_model_computes_transformers_states_and_scores(hf_dirs, converted, variant):
    hf, _ = hf_dirs[variant]
    bundle = loading.load(converted[variant])
    config = bundle.encoder
    assert (config.position_embedding, config.position_buckets) == ("relative", 8)
    assert config.type_vocab_size == VARIANTS[variant]["type_vocab_size"]
    ids, mask, segments = padded_batch(seed=len(variant))
    if not config.type_vocab_size:
        segments = np.zeros_like(segments)
    states, logits = our_outputs(bundle.params, config, ids, mask, segments)
    hf_states, hf_logits = hf_outputs(hf, ids, mask, segments)
    states, hf_states = at_tokens(states, mask), at_tokens(hf_states, mask)
    logits, hf_logits = at_tokens(logits, mask), at_tokens(hf_logits, mask)
    print(f"max |ours - transformers|: states {np.abs(states - hf_states).max():.2e}, "
          f"MLM logits {np.abs(logits - hf_logits).max():.2e}")
    np.testing.assert_allclose(states, hf_states, **TOL)
    np.testing.assert_allclose(logits, hf_logits, **TOL)
    assert np.abs(hf_logits).max() > 1.0  # not a comparison of near-zero values


def test_the_cli_names_what_deberta_lacks(hf_dirs, tmp_path, capsys):
    code, stdout, err = run_cli(convert, ["--from-hf", hf_dirs["v3"][1], "--output",
                                          str(tmp_path / "out")], capsys)
    assert code == 0 and "2 layers, hidden 48, 3 heads" in stdout, err
    assert "initialized fresh" in err and "pooler" in err and "NSP" in err
    assert "lm_predictions" not in err and "not imported" not in err


@pytest.mark.parametrize("variant", list(VARIANTS))
def test_export_gives_back_the_same_weights_bit_for_bit(hf_dirs, converted, tmp_path, capsys,
                                                        variant):
    hf, source = hf_dirs[variant]
    out = str(tmp_path / "hf")
    code, stdout, err = run_cli(export, ["--workdir", converted[variant], "--format", "hf",
                                         "--output", out], capsys)
    assert code == 0 and "wrote the Hugging Face export" in stdout, err
    ours, theirs = load_file(os.path.join(out, hf_files.SAFETENSORS)), hf.state_dict()
    # The export writes the lm_predictions head (legacy false): the legacy model's cls.predictions
    # are the same arrays under BERT's names.
    renamed = {name.replace("cls.predictions.transform.", "lm_predictions.lm_head.")
               .replace("cls.predictions.bias", "lm_predictions.lm_head.bias"): tensor
               for name, tensor in theirs.items() if not name.startswith("cls.predictions.decoder")}
    assert sorted(ours) == sorted(renamed)
    for name, tensor in renamed.items():
        assert np.array_equal(ours[name].view(np.uint32), tensor.numpy().view(np.uint32)), name
    with open(os.path.join(out, hf_files.CONFIG)) as f:
        config = json.load(f)
    assert (config["model_type"], config["architectures"]) == ("deberta-v2",
                                                               ["DebertaV2ForMaskedLM"])
    reloaded, info = DebertaV2ForMaskedLM.from_pretrained(out, output_loading_info=True,
                                                          attn_implementation="eager")
    assert not any(info.values()), info
    ids, mask, segments = padded_batch(seed=7)
    if not config["type_vocab_size"]:
        segments = np.zeros_like(segments)
    got, want = hf_outputs(reloaded.eval(), ids, mask, segments), hf_outputs(hf, ids, mask,
                                                                            segments)
    for a, b in zip(got, want):
        np.testing.assert_array_equal(a, b)


def test_a_bare_deberta_model_goes_out_as_one(tmp_path):
    """DebertaV2Model (no MLM head, no pooler) is imported and exported with every weight."""
    config = DebertaV2Config(vocab_size=300, type_vocab_size=0, **SIZES)
    hf = DebertaV2Model(config).eval()
    randomize(hf, seed=5)
    hf.save_pretrained(tmp_path / "hf")
    convert.main(["--from-hf", str(tmp_path / "hf"), "--output", str(tmp_path / "ours"),
                  "--no-scan-layers"])
    bundle = loading.load(str(tmp_path / "ours"))
    exported = hf_models.to_hf({"encoder": bundle.params["encoder"]}, bundle.encoder,
                               bundle.heads)
    assert exported.config["architectures"] == ["DebertaV2Model"]
    theirs = load_file(os.path.join(tmp_path / "hf", hf_files.SAFETENSORS))
    assert sorted(exported.state_dict) == sorted(theirs)
    for name, value in theirs.items():
        assert np.array_equal(exported.state_dict[name], value), name


def test_the_api_embeds_text_as_transformers_does(hf_dirs, converted):
    hf, source = hf_dirs["v3"]
    model = bertjax.load(converted["v3"])
    encoded = model.encode(TEXTS, layers=-1)
    expected = [Tokenizer.from_file(os.path.join(source, "tokenizer.json")).encode(t).ids
                for t in TEXTS]
    assert [list(e.ids) for e in encoded] == expected  # [CLS] ... [SEP], the file's own ids
    ids = np.zeros((len(TEXTS), max(map(len, expected))), np.int64)
    for row, row_ids in enumerate(expected):
        ids[row, :len(row_ids)] = row_ids
    states, _ = hf_outputs(hf, ids, (ids != 0).astype(np.int64), np.zeros_like(ids))
    for row, e in enumerate(encoded):
        np.testing.assert_allclose(e.hidden[0], states[-1, row, :len(e.ids)], **TOL)


def deberta_args(workdir, corpus_dir, **overrides):
    """tiny_args' 12 steps (32 tokens, then 64) on configs/deberta.py, tiny, 16 buckets."""
    settings = {"model.preset": "tiny", "model.position_buckets": 16,
                "model.max_relative_positions": 128, "data.vocab_size": 1000,
                "train.batch_size": 8, "schedule.long_max_predictions": 10, **overrides}
    args = tiny_args(workdir, corpus_dir, **settings)
    return [arg.replace("configs/tiny.py", "configs/deberta.py") for arg in args]


@pytest.fixture(scope="module")
def deberta_run(tmp_path_factory, small_corpus_dir):
    workdir = str(tmp_path_factory.mktemp("deberta_run") / "wd")
    result = run_child(deberta_args(workdir, small_corpus_dir))
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir


def test_a_deberta_run_exports_to_transformers(deberta_run, tmp_path, capsys):
    with open(os.path.join(deberta_run, "run.json")) as f:
        encoder = json.load(f)["encoder"]
    assert encoder["position_embedding"] == "relative" and encoder["position_buckets"] == 16
    out = str(tmp_path / "hf")
    code, stdout, err = run_cli(export, ["--workdir", deberta_run, "--format", "hf",
                                         "--output", out], capsys)
    assert code == 0, err
    hf, info = DebertaV2ForMaskedLM.from_pretrained(out, output_loading_info=True,
                                                    attn_implementation="eager")
    assert not any(info.values()), info
    bundle = loading.load(deberta_run)
    ids, mask, segments = padded_batch(seed=3, vocab=1000)
    _, logits = our_outputs(bundle.params, bundle.encoder, ids, mask, np.zeros_like(ids))
    _, hf_logits = hf_outputs(hf.eval(), ids, mask, np.zeros_like(ids))
    print(f"max |ours - transformers| MLM logits {np.abs(logits - hf_logits)[mask > 0].max():.2e}")
    np.testing.assert_allclose(at_tokens(logits, mask), at_tokens(hf_logits, mask), **TOL)


@pytest.mark.parametrize("setting, phrase", [
    ("model.attention_implementation=splash", "splash kernel cannot"),
    ("model.attention_implementation=xla", "xla kernel cannot"),
    ("model.sliding_window=16", "model.sliding_window"),
    ("model.norm=pre", "model.norm=pre"),
    ("model.share_layers=true", "does not combine with model.share_layers"),
    ("model.embedding_size=64", "does not combine with model.embedding_size"),
    ("model.position_buckets=300", "must exceed half of model.position_buckets"),
    ("model.position_buckets=-1", "must be >= 0"),
])
def test_settings_deberta_cannot_use_are_refused_before_the_workdir(tmp_path, small_corpus_dir,
                                                                    setting, phrase):
    workdir = tmp_path / "wd"
    argv = deberta_args(str(workdir), small_corpus_dir)[1:]
    run = cli_in_process.run("main", *argv, f"--config.{setting}")
    assert_one_line_error(run.returncode, run.stderr, phrase)
    assert not workdir.exists()


@pytest.mark.parametrize("change, phrase", [
    (dict(position_biased_input=True), "position_biased_input"),
    (dict(share_att_key=False), "share_att_key"),
    (dict(pos_att_type="c2p"), "pos_att_type"),
    (dict(norm_rel_ebd="none"), "norm_rel_ebd"),
    (dict(conv_kernel_size=3), "conv_kernel_size"),
    (dict(hidden_act="relu"), "hidden_act"),
])
def test_deberta_checkpoints_bertjax_cannot_compute_are_refused(tmp_path, capsys, change,
                                                                phrase):
    config = DebertaV2Config(vocab_size=300, type_vocab_size=0, **{**SIZES, **change})
    DebertaV2ForMaskedLM(config).save_pretrained(tmp_path / "hf")
    code, _, err = run_cli(convert, ["--from-hf", str(tmp_path / "hf"), "--output",
                                     str(tmp_path / "out")], capsys)
    assert_one_line_error(code, err, phrase)
    assert not (tmp_path / "out").exists()


def test_exact_resume_after_sigkill_across_the_length_switch(deberta_run, tmp_path,
                                                             small_corpus_dir):
    assert_resumes_exactly(deberta_run, str(tmp_path / "resumed"),
                           deberta_args(str(tmp_path / "resumed"), small_corpus_dir),
                           "encoder/relative_embeddings/table")


def assert_resumes_exactly(uninterrupted, resumed, args, parameter):
    """`args` (writing to `resumed`) SIGKILLed after checkpoint 5 and run again logs and ends
    with what the `uninterrupted` run did, bit for bit, `parameter` among the parameters."""
    result = run_child(args, KILL_AFTER_CHECKPOINT=5)
    assert result.returncode == -signal.SIGKILL, result.stderr[-2000:]
    result = run_child(args)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "resuming from step 5" in result.stderr
    assert logged(resumed) == logged(uninterrupted)
    a, b = flat(loading.load(uninterrupted).params), flat(loading.load(resumed).params)
    assert a.keys() == b.keys() and parameter in a
    for name in a:
        np.testing.assert_array_equal(a[name], b[name], err_msg=name)


def test_an_electra_run_on_deberta_gives_the_generator_its_own_table(tmp_path, small_corpus_dir):
    """DeBERTa-v3's replaced token detection: the generator (base.py's electra section) has
    its own relative table, of its own width, and shares the word embeddings."""
    workdir = str(tmp_path / "electra")
    result = run_child(deberta_args(workdir, small_corpus_dir, objective="electra",
                                    **{"train.steps": 3, "train.eval_every": 0,
                                       "schedule.long_fraction": 0.0}))
    assert result.returncode == 0, result.stderr[-3000:]
    train = [r for r in logged(workdir) if "loss" in r]
    assert len(train) == 3 and all(np.isfinite(r["rtd_loss"]) for r in train)
    params = flat(loading.load(workdir).params)
    generator, discriminator = (params[f"{part}/relative_embeddings/table"]
                                for part in ("generator", "encoder"))
    assert generator.shape[0] == discriminator.shape[0] == 32
    assert generator.shape[1] < discriminator.shape[1]
    out = str(tmp_path / "hf")  # the discriminator, as DeBERTa-v3 releases it
    run = cli_in_process.run("export", "--workdir", workdir, "--format", "hf", "--output", out)
    assert run.returncode == 0, run.stderr
    assert_exported_encoder_matches(out, workdir, seed=4)


def assert_exported_encoder_matches(out, workdir, seed) -> float:
    """The export at `out` loads in DebertaV2Model with every weight and gives the hidden states
    of the workdir's encoder (padded rows, within TOL); returns the largest difference."""
    hf, info = DebertaV2Model.from_pretrained(out, output_loading_info=True,
                                              attn_implementation="eager")
    assert not any(info.values()), info
    bundle = loading.load(workdir)
    ids, mask, _ = padded_batch(seed=seed, vocab=1000)
    ours = Encoder(bundle.encoder).apply({"params": bundle.params["encoder"]}, ids,
                                         np.zeros_like(ids), mask).sequence
    with torch.no_grad():
        theirs = hf.eval()(input_ids=torch.tensor(ids, dtype=torch.long),
                           attention_mask=torch.tensor(mask)).last_hidden_state.numpy()
    ours, theirs = at_tokens(np.asarray(ours), mask), at_tokens(theirs, mask)
    np.testing.assert_allclose(ours, theirs, **TOL)
    return float(np.abs(ours - theirs).max())


def test_a_sharded_deberta_step_equals_the_one_device_step():
    """Data, FSDP and tensor parallel at once (2 x 2 x 2 fake CPU devices, remat save_dots):
    the relative table and the position terms shard with the heads and give the one-device
    step's metrics and parameters."""
    config = preset("tiny", vocab_size=sharded.V, num_heads=8, max_position_embeddings=64,
                    scan_layers=True, position_embedding="relative", position_buckets=8,
                    max_relative_positions=32)
    single = sharded._train(BertForPretraining(config),
                            make_mesh(1, 1, 1, devices=jax.devices()[:1]))
    run = sharded._train(BertForPretraining(config.replace(remat="save_dots")),
                         make_mesh(2, 2, 2), start=single["initial"])
    for got, want in zip(run["metrics"], single["metrics"]):
        sharded._close(got, want)
    sharded._close(run["final"].params, single["final"].params, atol=1e-5)
    assert "relative_embeddings" in run["final"].params["encoder"]


@pytest.mark.parametrize("change", [dict(mlp="geglu"), dict(use_bias=False)])
def test_a_deberta_encoder_transformers_cannot_hold_is_refused_on_export(change):
    model = preset("tiny", vocab_size=100, position_embedding="relative", **change)
    with pytest.raises(UserError, match="no DebertaV2 counterpart"):
        hf_models.to_hf({}, model, {})
