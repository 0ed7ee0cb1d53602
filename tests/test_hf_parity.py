"""The outside oracle: Hugging Face transformers' PyTorch BERT, run on the same weights and text.

Random `BertForPreTraining` models of awkward shapes (odd head counts, intermediate sizes that are
not 4x) and the real pretrained MiniLM are converted with `from_hf_state_dict` and must agree with
our encoder and heads to fp32 rounding; our parameters exported with `to_hf_state_dict` must load
strictly into transformers.
"""

import json
import os

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from safetensors.numpy import load_file
from transformers import BertConfig, BertForPreTraining, BertModel

from bertjax.data.tokenizer import WordPieceTokenizer
from bertjax.core.errors import UserError
from bertjax.interop import hf_bert_config, hf_layout
from bertjax.model.config import EncoderConfig
from bertjax.model.encoder import Encoder
from bertjax.model.heads import BertForPretraining
from hf_reference import PAIRS, TOL, randomize, run_hf, run_ours, text_batch

SHAPES = [  # hidden, heads, intermediate, layers, scan, token types
    (60, 3, 100, 1, False, True),
    (60, 5, 150, 3, True, False),
    (63, 7, 130, 2, True, True),
    (60, 5, 90, 2, False, False),
]


@pytest.mark.parametrize("hidden,heads,intermediate,layers,scan,token_types", SHAPES)
def test_random_bert_for_pretraining_matches_transformers(
        bert_vocab_path, hidden, heads, intermediate, layers, scan, token_types):
    hf_config = BertConfig(
        vocab_size=30522, hidden_size=hidden, num_attention_heads=heads,
        intermediate_size=intermediate, num_hidden_layers=layers, max_position_embeddings=64,
        attn_implementation="eager")
    hf = BertForPreTraining(hf_config).eval()
    randomize(hf, seed=hidden + layers)
    config = hf_bert_config.encoder_config_from_hf(hf_config.to_dict(), scan_layers=scan)
    params, missing, unused = hf_layout.from_hf_state_dict(hf.state_dict(), config)
    assert missing == [] and unused == []

    batch = text_batch(bert_vocab_path, pairs=token_types, seed=layers)
    if not token_types:
        assert not batch["segment_ids"].any()
    out, sequence, pooled = run_ours(params, config, batch)
    mlm, nsp, hf_sequence, hf_pooled = run_hf(hf, batch, token_types)
    np.testing.assert_allclose(sequence, hf_sequence, **TOL)
    np.testing.assert_allclose(pooled, hf_pooled, **TOL)
    np.testing.assert_allclose(out["mlm_logits"], mlm, **TOL)
    np.testing.assert_allclose(out["nsp_logits"], nsp, **TOL)
    assert np.abs(mlm).max() > 1.0  # the comparison is not between near-zero values


def test_pretrained_minilm_matches_transformers(minilm_dir, bert_vocab_path):
    with open(os.path.join(minilm_dir, "config.json")) as f:
        config = hf_bert_config.encoder_config_from_hf(json.load(f), scan_layers=True)
    assert (config.num_layers, config.hidden_size, config.num_heads) == (6, 384, 12)
    state_dict = load_file(os.path.join(minilm_dir, "model.safetensors"))
    params, missing, unused = hf_layout.from_hf_state_dict(state_dict, config)
    # A bare BertModel: every head is reported missing, and nothing is left over.
    assert sorted(missing) == [
        "cls.predictions.bias", "cls.predictions.transform.LayerNorm.bias",
        "cls.predictions.transform.LayerNorm.weight", "cls.predictions.transform.dense.bias",
        "cls.predictions.transform.dense.weight", "cls.seq_relationship.bias",
        "cls.seq_relationship.weight"]
    assert unused == []

    hf = BertModel.from_pretrained(minilm_dir, dtype=torch.float32,
                                   attn_implementation="eager").eval()
    batch = text_batch(bert_vocab_path, pairs=True)
    torch_batch = {k: torch.from_numpy(v).long() for k, v in batch.items()}
    with torch.no_grad():
        want = hf(input_ids=torch_batch["input_ids"], attention_mask=torch_batch["input_mask"],
                  token_type_ids=torch_batch["segment_ids"])
    got = jax.jit(Encoder(config).apply)({"params": params["encoder"]}, batch["input_ids"],
                                         batch["segment_ids"], batch["input_mask"])
    np.testing.assert_allclose(got.sequence, want.last_hidden_state.numpy(), **TOL)
    np.testing.assert_allclose(got.pooled, want.pooler_output.numpy(), **TOL)


def _init_params(config: EncoderConfig) -> dict:
    """Parameters of our own model (real init, small sizes only)."""
    batch = {k: jnp.zeros((1, 4), jnp.int32)
             for k in ("input_ids", "segment_ids", "input_mask", "masked_positions")}
    shapes = jax.eval_shape(BertForPretraining(config).init, jax.random.key(0), batch)
    rng = np.random.default_rng(0)
    return jax.tree.map(lambda s: rng.normal(size=s.shape).astype(s.dtype),
                        nn.unbox(shapes)["params"])


def small_config(**changes) -> EncoderConfig:
    fields = dict(vocab_size=50, hidden_size=30, num_layers=2, num_heads=3,
                  intermediate_size=44, max_position_embeddings=20)
    return EncoderConfig(**{**fields, **changes})


@pytest.mark.parametrize("scan", [False, True])
@pytest.mark.parametrize("param_dtype", ["float32", "bfloat16"])
def test_round_trip_through_the_hf_layout_is_bit_identical(scan, param_dtype):
    config = small_config(scan_layers=scan, param_dtype=param_dtype)
    params = _init_params(config)
    state_dict = hf_layout.to_hf_state_dict(params, config)
    back, missing, unused = hf_layout.from_hf_state_dict(state_dict, config)
    assert missing == [] and unused == []
    assert jax.tree.structure(back) == jax.tree.structure(params)
    for a, b in zip(jax.tree.leaves(back), jax.tree.leaves(params)):
        assert a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a.view(np.uint16 if param_dtype == "bfloat16" else np.uint32),
                              b.view(np.uint16 if param_dtype == "bfloat16" else np.uint32))
    # The other layout reads the same state dict: loop <-> scan conversion for free.
    other, _, _ = hf_layout.from_hf_state_dict(state_dict, config, scan_layers=not scan)
    assert ("layers" in other["encoder"]) == (not scan)


def test_export_loads_strictly_into_transformers_and_computes_the_same(bert_vocab_path):
    config = small_config(vocab_size=30522, max_position_embeddings=64)
    params = _init_params(config)
    params = jax.tree.map(lambda x: (x * 0.1).astype(x.dtype), params)
    hf = BertForPreTraining(BertConfig(**hf_bert_config.hf_config_dict(config),
                                       attn_implementation="eager")).eval()
    state_dict = hf_layout.to_hf_state_dict(params, config)
    hf.load_state_dict({k: torch.from_numpy(v) for k, v in state_dict.items()}, strict=True)
    batch = text_batch(bert_vocab_path, pairs=True)
    out, sequence, _ = run_ours(params, config, batch)
    mlm, nsp, hf_sequence, _ = run_hf(hf, batch, token_types=True)
    np.testing.assert_allclose(sequence, hf_sequence, **TOL)
    np.testing.assert_allclose(out["mlm_logits"], mlm, **TOL)
    np.testing.assert_allclose(out["nsp_logits"], nsp, **TOL)

    bare = hf_layout.to_hf_state_dict(params, config, include_heads=False)
    assert all(not k.startswith(("bert.", "cls.")) for k in bare)
    BertModel(BertConfig(**hf_bert_config.hf_config_dict(config))).load_state_dict(
        {k: torch.from_numpy(v) for k, v in bare.items()}, strict=True)
    no_nsp = hf_layout.to_hf_state_dict(params, config, nsp=False)
    assert set(state_dict) - set(no_nsp) == {"cls.seq_relationship.weight",
                                             "cls.seq_relationship.bias"}


def test_import_accepts_old_names_and_reports_what_it_cannot_use():
    config = small_config()
    state_dict = hf_layout.to_hf_state_dict(_init_params(config), config)
    renamed = {}
    for name, value in state_dict.items():
        name = name.removeprefix("bert.")  # BertModel-style names with BertForPreTraining heads
        name = name.replace("LayerNorm.weight", "LayerNorm.gamma")  # TF-converted checkpoints
        renamed[name.replace("LayerNorm.bias", "LayerNorm.beta")] = value
    renamed["cls.predictions.decoder.weight"] = renamed["cls.predictions.decoder.weight"] + 1.0
    renamed["bert.embeddings.position_ids"] = np.arange(20)[None]  # a buffer, not a weight
    renamed["encoder.layer.2.output.dense.bias"] = np.zeros(30, np.float32)  # one layer too many
    del renamed["cls.seq_relationship.bias"]
    params, missing, unused = hf_layout.from_hf_state_dict(renamed, config, scan_layers=False)
    assert missing == ["cls.seq_relationship.bias"]
    assert sorted(unused) == ["cls.predictions.decoder.weight",  # untied: we cannot represent it
                              "encoder.layer.2.output.dense.bias"]
    assert np.array_equal(params["encoder"]["embeddings"]["layer_norm"]["scale"],
                          state_dict["bert.embeddings.LayerNorm.weight"])


def test_import_rejects_weights_that_do_not_fit_the_config():
    config = small_config()
    state_dict = hf_layout.to_hf_state_dict(_init_params(config), config)
    with pytest.raises(UserError, match=r"word_embeddings.weight has shape \(50, 30\)"):
        hf_layout.from_hf_state_dict(state_dict, config.replace(num_heads=5, hidden_size=35))
    with pytest.raises(UserError, match="intermediate.dense.weight has shape"):
        hf_layout.from_hf_state_dict(state_dict, config.replace(intermediate_size=40))


def test_configs_convert_both_ways_and_unsupported_models_are_user_errors():
    config = small_config(hidden_dropout=0.05, layer_norm_eps=1e-7, type_vocab_size=3)
    hf_dict = hf_bert_config.hf_config_dict(config)
    assert BertConfig(**hf_dict).num_hidden_layers == 2
    assert hf_bert_config.encoder_config_from_hf(hf_dict) == config
    assert hf_bert_config.encoder_config_from_hf(
        BertConfig(**hf_dict).to_dict(), dtype="bfloat16").dtype == "bfloat16"
    for key, value in [("model_type", "roberta"),
                       ("position_embedding_type", "relative_key_query"),
                       ("hidden_act", "relu")]:
        with pytest.raises(UserError, match=f"unsupported {key} '{value}'"):
            hf_bert_config.encoder_config_from_hf({**hf_dict, key: value})
    # transformers' "gelu_new" is the tanh approximation, which the encoder computes too.
    tanh = hf_bert_config.encoder_config_from_hf({**hf_dict, "hidden_act": "gelu_new"})
    assert tanh == config.replace(activation="gelu_tanh")
    assert hf_bert_config.hf_config_dict(tanh)["hidden_act"] == "gelu_new"
    with pytest.raises(UserError, match="not divisible"):
        hf_bert_config.encoder_config_from_hf({**hf_dict, "num_attention_heads": 7})
    with pytest.raises(UserError, match="bad model setting"):
        hf_bert_config.encoder_config_from_hf(hf_dict, no_such_field=1)
