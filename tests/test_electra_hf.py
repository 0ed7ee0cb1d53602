"""The outside oracle for ELECTRA: our generator and discriminator, with random values in every
parameter, exported to Hugging Face's layout, loaded by transformers' ElectraForMaskedLM and
ElectraForPreTraining with nothing missing or unexpected, and equal to ours within 1e-5 (fp32);
and one training step's loss and gradients equal to transformers'."""

import os

import flax.linen as nn
import jax
import numpy as np
import pytest
import torch
from transformers import ElectraForMaskedLM, ElectraForPreTraining

from bertjax.interop import hf_electra, hf_files
from bertjax.model.config import preset
from bertjax.model.electra import DiscriminatorHead, ElectraForPretraining
from bertjax.model.encoder import Encoder
from bertjax.train.electra_objective import electra_objective

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

TOL = dict(atol=1e-5, rtol=1e-5)
V = 97


def batch(seed=0):
    rng = np.random.default_rng(seed)
    ids = rng.integers(5, V, size=(3, 12)).astype(np.int32)
    mask = np.ones((3, 12), np.int32)
    mask[1, 9:] = 0
    mask[2, 6:] = 0
    segments = np.zeros((3, 12), np.int32)
    segments[0, 7:] = 1
    positions = np.array([[1, 4, 8], [2, 3, 7], [1, 2, 5]], np.int32)
    return {"input_ids": ids * mask, "segment_ids": segments, "input_mask": mask,
            "masked_positions": positions, "masked_ids": ids[np.arange(3)[:, None], positions],
            "masked_weights": np.ones((3, 3), np.float32)}


def random_params(model, b, seed):
    """Every leaf random (biases and LayerNorms too), so every mapping is exercised."""
    shapes = jax.eval_shape(lambda key: model.init({"params": key}, b), jax.random.PRNGKey(0))
    params = nn.meta.unbox(shapes["params"])
    rng = np.random.default_rng(seed)  # numpy, from the shapes alone: nothing to compile
    return jax.tree.map(lambda x: (0.1 * rng.standard_normal(x.shape) + (x.ndim == 1))
                        .astype(np.float32), params)


SHAPES = [  # discriminator hidden, heads, layers; generator hidden, heads, intermediate; scan
    (48, 4, 2, 16, 2, 40, True),
    (36, 3, 3, 36, 3, 50, False),  # equal widths: no embeddings_project
    (40, 5, 2, 12, 1, 30, False),
]


@pytest.mark.parametrize("hidden,heads,layers,g_hidden,g_heads,g_inter,scan", SHAPES)
@pytest.mark.slow
def test_exported_electra_matches_transformers(tmp_path, hidden, heads, layers, g_hidden,
                                               g_heads, g_inter, scan):
    disc = preset("tiny", vocab_size=V, hidden_size=hidden, num_heads=heads, num_layers=layers,
                  intermediate_size=2 * hidden + 2, max_position_embeddings=24,
                  hidden_dropout=0.0, attention_dropout=0.0, scan_layers=scan)
    gen = disc.replace(hidden_size=g_hidden, num_heads=g_heads, intermediate_size=g_inter)
    model = ElectraForPretraining(disc, gen)
    b = batch(hidden)
    params = random_params(model, b, seed=hidden)
    heads = {"nsp": False, "electra": {"generator": gen.__dict__}}
    exported = hf_electra.to_hf(params, disc, heads)
    for subdir, hf in exported.items():
        (tmp_path / (subdir or "disc")).mkdir()
        hf_files.write_model(str(tmp_path / (subdir or "disc")), hf.config, hf.state_dict)
    assert ("electra.embeddings_project.weight" in exported["generator"].state_dict) == (
        g_hidden != hidden)

    discriminator, info_d = ElectraForPreTraining.from_pretrained(
        tmp_path / "disc", output_loading_info=True, attn_implementation="eager")
    generator, info_g = ElectraForMaskedLM.from_pretrained(
        tmp_path / "generator", output_loading_info=True, attn_implementation="eager")
    for info in (info_d, info_g):
        assert not info["missing_keys"] and not info["unexpected_keys"], info
        assert not info["mismatched_keys"], info

    args = dict(input_ids=torch.from_numpy(b["input_ids"]).long(),
                attention_mask=torch.from_numpy(b["input_mask"]).long(),
                token_type_ids=torch.from_numpy(b["segment_ids"]).long())
    with torch.no_grad():
        rtd_hf = discriminator.eval()(**args).logits.numpy()
        mlm_hf = generator.eval()(**args).logits.numpy()
    real = b["input_mask"].astype(bool)

    ours = jax.jit(lambda p, x: model.apply({"params": p}, x))(params, b)
    mlm_hf = np.take_along_axis(mlm_hf, b["masked_positions"][..., None].astype(np.int64), 1)
    np.testing.assert_allclose(ours["mlm_logits"], mlm_hf, **TOL)

    # The discriminator on the uncorrupted ids (ours samples replacements inside the model).
    def discriminate(p, x):
        encoded = Encoder(disc).apply({"params": p["encoder"]}, x["input_ids"],
                                      x["segment_ids"], x["input_mask"])
        return DiscriminatorHead(disc).apply({"params": p["discriminator_head"]},
                                             encoded.sequence)

    rtd = jax.jit(discriminate)(params, b)
    np.testing.assert_allclose(np.asarray(rtd)[real], rtd_hf[real], **TOL)
    assert np.abs(rtd_hf[real]).max() > 0.1  # not a degenerate comparison


@pytest.mark.slow
def test_the_training_loss_and_its_gradients_are_transformers(monkeypatch):
    """One training step's loss (MLM + 50 * RTD, the generator's samples in place) and the
    gradient of every parameter, ours against transformers' ELECTRA holding the same values with
    its embeddings shared (benchmarks/electra_reference.py's oracle; it trains both after this)."""
    monkeypatch.syspath_prepend(os.path.join(REPO, "benchmarks"))
    import electra_reference

    disc = preset("tiny", vocab_size=V, hidden_size=48, num_heads=4, num_layers=2,
                  intermediate_size=98, max_position_embeddings=24, hidden_dropout=0.0,
                  attention_dropout=0.0)
    gen = disc.replace(hidden_size=16, num_heads=2, intermediate_size=40)
    model = ElectraForPretraining(disc, gen)
    b = batch(7)
    params = random_params(model, b, seed=7)
    heads = {"nsp": False, "electra": {"generator": gen.__dict__}}
    hf_disc, hf_gen = electra_reference.torch_models(params, disc, heads)
    ours, theirs, differences = electra_reference.one_step_difference(
        model, electra_objective(50.0), params, hf_disc, hf_gen, b, 50.0, disc, heads)
    assert abs(ours - theirs) <= 1e-5 * abs(ours)
    assert len(differences) > 30  # every parameter of both parts, shared ones once
    for name, (largest, difference) in differences.items():
        assert difference <= 1e-5 * max(largest, 1.0), name
    assert max(largest for largest, _ in differences.values()) > 1e-2
