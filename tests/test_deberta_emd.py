"""DeBERTa's enhanced mask decoder (model.enhanced_mask_decoder): bertjax's decoder, gathered at
the masked positions, computes what transformers' last DebertaV2Layer computes when called twice
with query_states (the outside oracle: Microsoft's emd_context_layer, over every position); a
tiny configs/deberta.py run with the decoder trains, resumes exactly and exports its encoder as
DebertaV2Model; settings the decoder cannot honour are refused before the workdir exists.
"""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from transformers import DebertaV2Config, DebertaV2ForMaskedLM

import bertjax
from bertjax.cli import convert, export
from bertjax.core.errors import UserError
from bertjax.inference import loading
from bertjax.model.config import preset
from bertjax.model.enhanced_mask_decoder import EnhancedMaskDecoder
from bertjax.model.flops import train_step_flops
from bertjax.model.heads import BertForPretraining
from bertjax.parallel.mesh import make_mesh
from bertjax.settings import finetune as finetune_settings
import cli_in_process
from configs import finetune_sentiment
from cli_checks import assert_one_line_error, run_cli
from pretrain_runs import run_child
from hf_reference import randomize
from test_deberta import (SIZES, TOL, VARIANTS, assert_exported_encoder_matches,
                          assert_resumes_exactly, deberta_args, padded_batch, unigram_tokenizer)
from test_pretrain import logged
import test_sharded_steps as sharded
from trees import flat

pytestmark = pytest.mark.slow

PASSES = 2
# Per row: masked positions among its real tokens (rows of 40, 23 and 9), the last slot padding.
MASKED = np.array([[3, 17, 26, 39, 0], [1, 9, 12, 22, 0], [2, 4, 5, 8, 0]], np.int32)


@pytest.fixture(scope="module")
def masked_lm(tmp_path_factory, demo_articles):
    """A random DebertaV2ForMaskedLM (DeBERTa-v3's layout, 8 buckets) and its directory."""
    directory = tmp_path_factory.mktemp("masked_lm")
    tokenizer = unigram_tokenizer(s for d in demo_articles[:10] for s in d)
    config = DebertaV2Config(vocab_size=tokenizer.get_vocab_size(), **SIZES, **VARIANTS["v3"])
    model = DebertaV2ForMaskedLM(config).eval()
    randomize(model, seed=3)
    model.save_pretrained(directory)
    tokenizer.save(str(directory / "tokenizer.json"))
    return model, str(directory)


def transformers_decoder(hf, table, ids, mask):
    """Microsoft's emd_context_layer on transformers' model: the last layer twice, its keys and
    values the last layer's input, its queries hidden + table[position] and then its own output.
    Returns the query states at every position [B, L, H] and the MLM scores [B, L, V]."""
    encoder = hf.deberta.encoder
    with torch.no_grad():
        out = hf.deberta(input_ids=torch.tensor(ids, dtype=torch.long),
                         attention_mask=torch.tensor(mask), output_hidden_states=True)
        hidden = out.hidden_states[-2]
        attention_mask = encoder.get_attention_mask(torch.tensor(mask))
        relative_pos = encoder.get_rel_pos(hidden)
        rel_embeddings = encoder.get_rel_embedding()
        query = hidden + torch.tensor(table)[None, :ids.shape[1]]
        for _ in range(PASSES):
            query, _ = encoder.layer[-1](hidden, attention_mask, query_states=query,
                                         relative_pos=relative_pos,
                                         rel_embeddings=rel_embeddings)
        logits = hf.lm_predictions(query, hf.deberta.embeddings.word_embeddings)
    return query.numpy(), logits.numpy()


def bertjax_decoder(params, config, ids, mask):
    """(the decoder's query states [B, P, H], the MLM scores [B, P, V]) at MASKED."""
    model = BertForPretraining(config, nsp=False, enhanced_mask_decoder=PASSES)
    batch = {"input_ids": ids, "segment_ids": np.zeros_like(ids), "input_mask": mask,
             "masked_positions": MASKED}

    def forward(p, b):
        return model.apply({"params": p}, b, capture_intermediates=lambda module, _: isinstance(
            module, EnhancedMaskDecoder))

    outputs, state = jax.jit(forward)(params, {k: jnp.asarray(v) for k, v in batch.items()})
    (states,) = state["intermediates"]["emd"]["__call__"]
    return np.asarray(states), np.asarray(outputs["mlm_logits"])


@pytest.mark.parametrize("scan", [True, False])
def test_the_decoder_computes_transformers_last_layer_with_query_states(masked_lm, tmp_path,
                                                                        scan):
    hf, directory = masked_lm
    out = str(tmp_path / "ours")
    convert.main(["--from-hf", directory, "--output", out] + ([] if scan else
                                                               ["--no-scan-layers"]))
    bundle = loading.load(out)
    config = bundle.encoder
    assert config.scan_layers == scan and config.position_buckets == 8
    table = np.random.default_rng(11).normal(0.0, 0.5, (config.max_position_embeddings,
                                                        config.hidden_size)).astype(np.float32)
    params = {**bundle.params, "emd": {"positions": table}}
    ids, mask, _ = padded_batch(seed=5)
    states, logits = bertjax_decoder(params, config, ids, mask)
    hf_states, hf_logits = transformers_decoder(hf, table, ids, mask)
    rows = np.arange(len(ids))[:, None]
    hf_states, hf_logits = hf_states[rows, MASKED], hf_logits[rows, MASKED]
    print(f"max |ours - transformers|: decoder states {np.abs(states - hf_states).max():.2e}, "
          f"MLM logits {np.abs(logits - hf_logits).max():.2e}")
    np.testing.assert_allclose(states, hf_states, **TOL)
    np.testing.assert_allclose(logits, hf_logits, **TOL)
    assert np.abs(hf_logits).max() > 1.0
    # Not the last layer's own output there: the decoder changed the MLM head's input.
    _, plain = hf_outputs_at(hf, ids, mask)
    assert np.abs(plain - hf_logits).max() > 0.1


def hf_outputs_at(hf, ids, mask):
    with torch.no_grad():
        logits = hf(input_ids=torch.tensor(ids, dtype=torch.long),
                    attention_mask=torch.tensor(mask)).logits.numpy()
    return None, logits[np.arange(len(ids))[:, None], MASKED]


def test_the_decoder_counts_in_the_model_flops():
    model = preset("base", vocab_size=128_000, position_embedding="relative")
    without = train_step_flops(model, 8, 512, 77, nsp=False)
    with_decoder = train_step_flops(model, 8, 512, 77, nsp=False, decoder_passes=2)
    assert without.mask_decoder == 0.0
    assert with_decoder.total - without.total == with_decoder.mask_decoder > 0.0
    # Two passes over 77 query rows cost far less than one more layer over 512 rows.
    one_layer = (without.encoder_matmuls + without.attention) / model.num_layers
    print(f"decoder {with_decoder.mask_decoder:.3e} FLOPs, one layer {one_layer:.3e}")
    assert with_decoder.mask_decoder < one_layer


@pytest.fixture(scope="module")
def decoder_run(tmp_path_factory, small_corpus_dir):
    workdir = str(tmp_path_factory.mktemp("decoder_run") / "wd")
    result = run_child(deberta_args(workdir, small_corpus_dir, **DECODER))
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir


DECODER = {"model.enhanced_mask_decoder": PASSES}


def test_a_run_with_the_decoder_trains_it_beside_the_heads(decoder_run):
    with open(os.path.join(decoder_run, "run.json")) as f:
        record = json.load(f)
    assert record["heads"]["enhanced_mask_decoder"] == PASSES
    train = [r for r in logged(decoder_run) if "loss" in r]
    assert len(train) == 12 and all(np.isfinite(r["loss"]) for r in train)
    params = flat(loading.load(decoder_run).params)
    config = loading.load(decoder_run).encoder
    table = params["emd/positions"]
    assert table.shape == (config.max_position_embeddings, config.hidden_size)
    assert not any(name.startswith("mlm/emd") or "positions" in name.split("/")[1]
                   for name in params if name.startswith("encoder/"))


def test_a_run_with_the_decoder_resumes_exactly_after_sigkill(decoder_run, tmp_path,
                                                              small_corpus_dir):
    resumed = str(tmp_path / "resumed")
    assert_resumes_exactly(decoder_run, resumed,
                           deberta_args(resumed, small_corpus_dir, **DECODER), "emd/positions")


def test_the_decoder_is_not_dropped_on_resume(decoder_run, small_corpus_dir, tmp_path):
    workdir = str(tmp_path / "copy")
    shutil.copytree(decoder_run, workdir)
    before = sorted(os.listdir(os.path.join(workdir, "checkpoints")))
    run = cli_in_process.run("main", *deberta_args(workdir, small_corpus_dir,
                                                   **{"train.steps": 13})[1:])
    assert_one_line_error(run.returncode, run.stderr, "enhanced_mask_decoder=2",
                          "enhanced_mask_decoder=0")
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == before


def test_a_run_with_the_decoder_exports_its_encoder_to_transformers(decoder_run, tmp_path,
                                                                    capsys):
    out = str(tmp_path / "hf")
    code, stdout, err = run_cli(export, ["--workdir", decoder_run, "--format", "hf",
                                         "--output", out], capsys)
    assert code == 0, err
    assert "enhanced mask decoder" in err and "DebertaV2Model" in err
    with open(os.path.join(out, "config.json")) as f:
        assert json.load(f)["architectures"] == ["DebertaV2Model"]
    difference = assert_exported_encoder_matches(out, decoder_run, seed=6)
    print(f"max |ours - transformers| hidden states {difference:.2e}")


@pytest.mark.parametrize("config_file, settings, phrase", [
    ("deberta", {"model.enhanced_mask_decoder": -1}, "must be an integer of at least 0"),
    ("deberta", {"model.enhanced_mask_decoder": 2, "objective": "electra"},
     "objective electra has no plain MLM head"),
    ("tiny", {"model.enhanced_mask_decoder": 2}, "needs model.position_embedding=relative"),
])
def test_settings_the_decoder_cannot_use_are_refused_before_the_workdir(
        tmp_path, small_corpus_dir, config_file, settings, phrase):
    workdir = tmp_path / "wd"
    argv = deberta_args(str(workdir), small_corpus_dir)[1:]
    argv = [arg.replace("configs/deberta.py", f"configs/{config_file}.py") for arg in argv]
    run = cli_in_process.run("main", *argv, *(f"--config.{k}={v}" for k, v in settings.items()))
    assert_one_line_error(run.returncode, run.stderr, phrase)
    assert not workdir.exists()


def test_fine_tuning_refuses_the_decoder():
    config = finetune_sentiment.get_config()
    config.model.enhanced_mask_decoder = 2
    with pytest.raises(UserError, match="pretraining head"):
        finetune_settings.read(config, require_data=False)


def test_fill_mask_reads_the_decoder_the_run_trained(decoder_run):
    model = bertjax.load(decoder_run)
    text = "the river runs through the [MASK] of the old town."
    (predicted,) = model.fill_mask(text, top_k=3)
    ids, segments = model._masked_row(text)
    bundle = loading.load(decoder_run)
    position = int(np.flatnonzero(ids == model.tokenizer.special.mask)[0])
    batch = {"input_ids": ids[None], "segment_ids": segments[None],
             "input_mask": np.ones_like(ids)[None],
             "masked_positions": np.array([[position]], np.int32)}
    pretraining = BertForPretraining(bundle.encoder, nsp=False, enhanced_mask_decoder=PASSES)
    logits = pretraining.apply({"params": bundle.params}, batch)["mlm_logits"][0, 0]
    probs = np.asarray(jax.nn.softmax(logits))
    top = np.argsort(-probs)[:3]
    assert [token for token, _ in predicted] == [model.tokenizer.id_to_token(int(t)) for t in top]
    np.testing.assert_allclose([p for _, p in predicted], probs[top], rtol=1e-4)


def test_packed_documents_are_decoded_as_rows_of_their_own():
    """data.separate_documents: two documents in one row (positions restarting, attention within
    each) give the decoder's scores of the two as separate rows."""
    config = preset("tiny", vocab_size=100, position_embedding="relative", position_buckets=8,
                    max_relative_positions=32, max_position_embeddings=64)
    model = BertForPretraining(config, nsp=False, enhanced_mask_decoder=PASSES)
    rng = np.random.default_rng(0)
    first, second = rng.integers(5, 100, 14), rng.integers(5, 100, 10)
    packed = {"input_ids": np.concatenate([first, second])[None].astype(np.int32),
              "input_mask": np.ones((1, 24), np.int32),
              "positions": np.concatenate([np.arange(14), np.arange(10)])[None].astype(np.int32),
              "pack_ids": np.repeat([1, 2], [14, 10])[None].astype(np.int32),
              "masked_positions": np.array([[2, 11, 15, 22]], np.int32)}
    packed["segment_ids"] = np.zeros_like(packed["input_ids"])
    alone = {"input_ids": np.zeros((2, 14), np.int32), "input_mask": np.zeros((2, 14), np.int32),
             "masked_positions": np.array([[2, 11], [1, 8]], np.int32)}
    for row, ids in enumerate((first, second)):
        alone["input_ids"][row, :len(ids)] = ids
        alone["input_mask"][row, :len(ids)] = 1
    alone["segment_ids"] = np.zeros_like(alone["input_ids"])
    params = model.init(jax.random.PRNGKey(0), packed)["params"]
    got = np.asarray(model.apply({"params": params}, packed)["mlm_logits"])[0]
    want = np.asarray(model.apply({"params": params}, alone)["mlm_logits"]).reshape(4, -1)
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_a_sharded_step_with_the_decoder_equals_the_one_device_step():
    """Data, FSDP and tensor parallel at once (2 x 2 x 2 fake CPU devices, remat save_dots):
    the decoder's gathers shard with the heads and give the one-device step."""
    config = preset("tiny", vocab_size=sharded.V, num_heads=8, max_position_embeddings=64,
                    scan_layers=True, position_embedding="relative", position_buckets=8,
                    max_relative_positions=32)
    single = sharded._train(BertForPretraining(config, enhanced_mask_decoder=PASSES),
                            make_mesh(1, 1, 1, devices=jax.devices()[:1]))
    run = sharded._train(BertForPretraining(config.replace(remat="save_dots"),
                                            enhanced_mask_decoder=PASSES),
                         make_mesh(2, 2, 2), start=single["initial"])
    for got, want in zip(run["metrics"], single["metrics"]):
        sharded._close(got, want)
    sharded._close(run["final"].params, single["final"].params, atol=1e-5)
    assert "positions" in run["final"].params["emd"]
