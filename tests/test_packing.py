"""Packing several sequences into one row changes nothing they compute: a packed row's
per-sequence hidden states and MLM logits equal those of the sequences run alone (fp32, 1e-5),
for BERT's architecture and ModernBERT's (rotary positions, sliding windows across which a packed
neighbour would otherwise be seen)."""

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.model.config import preset
from bertjax.model.heads import BertForPretraining

MODERN = dict(position_embedding="rope", rope_theta=160_000.0, norm="pre", mlp="geglu",
              use_bias=False, norm_bias=False, global_attention_every=3, sliding_window=6,
              type_vocab_size=0, layer_norm_eps=1e-5)
LENGTHS = (9, 5, 11)  # packed into one row of 32: 25 tokens, then padding


def _config(architecture: dict, scan: bool):
    return preset("tiny", num_layers=3, hidden_size=32, num_heads=2, intermediate_size=64,
                  vocab_size=97, max_position_embeddings=32, hidden_dropout=0.0,
                  attention_dropout=0.0, scan_layers=scan, **architecture)


def _sequences():
    rng = np.random.default_rng(0)
    return [rng.integers(5, 97, n).astype(np.int32) for n in LENGTHS]


def _alone(seq: np.ndarray, length: int = 32) -> dict:
    n = len(seq)
    ids = np.zeros((1, length), np.int32)
    ids[0, :n] = seq
    mask = (np.arange(length) < n).astype(np.int32)[None]
    return {"input_ids": ids, "segment_ids": np.zeros_like(ids), "input_mask": mask,
            "masked_positions": np.arange(length, dtype=np.int32)[None]}


def _packed(sequences, length: int = 32) -> dict:
    ids, pack_ids, positions = (np.zeros((1, length), np.int32) for _ in range(3))
    start = 0
    for number, seq in enumerate(sequences, start=1):
        stop = start + len(seq)
        ids[0, start:stop], pack_ids[0, start:stop] = seq, number
        positions[0, start:stop] = np.arange(len(seq))
        start = stop
    mask = (np.arange(length) < start).astype(np.int32)[None]
    return {"input_ids": ids, "segment_ids": np.zeros_like(ids), "input_mask": mask,
            "positions": positions, "pack_ids": pack_ids,
            "masked_positions": np.arange(length, dtype=np.int32)[None]}


@pytest.mark.parametrize("architecture", [{}, MODERN], ids=["bert", "modernbert"])
@pytest.mark.parametrize("scan", [True, False], ids=["scan", "loop"])
@pytest.mark.slow
def test_packed_sequences_compute_what_they_compute_alone(architecture, scan):
    config = _config(architecture, scan)
    model = BertForPretraining(config, nsp=False)
    sequences = _sequences()
    packed = _packed(sequences)
    params = nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), packed))
    together = np.asarray(jax.jit(model.apply)(params, packed)["mlm_logits"])[0]
    start = 0
    for seq in sequences:
        alone = np.asarray(jax.jit(model.apply)(params, _alone(seq))["mlm_logits"])[0]
        np.testing.assert_allclose(together[start:start + len(seq)], alone[:len(seq)],
                                   atol=1e-5, rtol=1e-5)
        start += len(seq)


def test_without_pack_ids_a_packed_row_would_leak_between_sequences():
    """The check above can fail: drop the block-diagonal mask and the first sequence's logits
    change, through attention to its neighbours."""
    config = _config(MODERN, scan=True)
    model = BertForPretraining(config, nsp=False)
    sequences = _sequences()
    packed = _packed(sequences)
    params = nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), packed))
    leaky = {k: v for k, v in packed.items() if k != "pack_ids"}
    apply = jax.jit(model.apply)
    together = np.asarray(apply(params, leaky)["mlm_logits"])[0, :LENGTHS[0]]
    alone = np.asarray(apply(params, _alone(sequences[0]))["mlm_logits"])[0, :LENGTHS[0]]
    assert np.abs(together - alone).max() > 1e-3


@pytest.mark.slow
def test_a_packed_gradient_equals_the_sum_of_the_sequences_gradients():
    config = _config(MODERN, scan=True)
    model = BertForPretraining(config, nsp=False)
    sequences = _sequences()
    packed = _packed(sequences)
    params = nn.unbox(jax.jit(model.init)(jax.random.PRNGKey(0), packed))

    def loss(p, batch, weights):
        logits = model.apply(p, batch)["mlm_logits"]
        return jnp.sum(jax.nn.log_softmax(logits)[..., 7] * weights)

    packed_weights = packed["input_mask"].astype(np.float32)
    gradient = jax.jit(jax.grad(loss))
    together = gradient(params, packed, packed_weights)
    apart = [gradient(params, _alone(s), _alone(s)["input_mask"].astype(np.float32))
             for s in sequences]
    summed = jax.tree.map(lambda *g: sum(g), *apart)
    for a, b in zip(jax.tree.leaves(together), jax.tree.leaves(summed)):
        np.testing.assert_allclose(a, b, atol=1e-5, rtol=1e-4)
