"""Which attention a model traces: jax.nn.dot_product_attention (the call a backend fuses:
cuDNN flash attention on a GPU) whenever attention dropout is 0, in training too, with the
implementation the config asks for; the spelled-out softmax only for attention dropout."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from bertjax.cli import main
from bertjax.model.config import preset
from bertjax.model.encoder import Encoder

REAL = jax.nn.dot_product_attention


@pytest.fixture
def calls(monkeypatch):
    """Records every dot_product_attention call traced; computes it with XLA (cuDNN requests
    included: this machine has no GPU) from the mask or the key lengths it was given."""
    seen = []

    def recorder(query, key, value, bias=None, mask=None, *, implementation=None,
                 key_value_seq_lengths=None, **kwargs):
        seen.append({"implementation": implementation, "mask": mask is not None,
                     "lengths": key_value_seq_lengths})
        if key_value_seq_lengths is not None:
            mask = (jnp.arange(key.shape[1])[None, :] < key_value_seq_lengths[:, None])[
                :, None, None, :]
        return REAL(query, key, value, bias, mask, implementation="xla", **kwargs)

    monkeypatch.setattr(jax.nn, "dot_product_attention", recorder)
    return seen


def batch():
    rng = np.random.default_rng(0)
    ids = rng.integers(5, 100, (3, 16)).astype(np.int32)
    lengths = np.array([16, 9, 4])
    mask = (np.arange(16)[None] < lengths[:, None]).astype(np.int32)
    return ids * mask, np.zeros_like(ids), mask, lengths


def forward(config, calls, *, training: bool):
    """The encoder's output; `calls` then holds only this forward pass's attention calls."""
    ids, segments, mask, _ = batch()
    model = Encoder(config)
    params = model.init(jax.random.PRNGKey(0), ids, segments, mask, deterministic=True)
    calls.clear()
    return model.apply(params, ids, segments, mask, deterministic=not training,
                       rngs={"dropout": jax.random.PRNGKey(1)}).sequence


def tiny(**changes):
    return preset("tiny", vocab_size=100, hidden_dropout=0.0, **changes)


def test_training_without_attention_dropout_takes_the_fusable_call(calls):
    config = tiny(attention_dropout=0.0)
    forward(config, calls, training=True)
    assert len(calls) == config.num_layers
    assert all(c["implementation"] is None and c["mask"] for c in calls)


def test_attention_dropout_spells_training_out_but_not_inference(calls):
    config = tiny(attention_dropout=0.1)
    forward(config, calls, training=True)
    assert calls == []
    forward(config, calls, training=False)
    assert len(calls) == config.num_layers


def test_cudnn_is_asked_for_with_key_lengths_and_computes_the_same(calls):
    _, _, mask, lengths = batch()
    fused = forward(tiny(attention_dropout=0.0, attention_implementation="cudnn"),
                    calls, training=True)
    assert len(calls) == 2 and all(c["implementation"] == "cudnn" and not c["mask"]
                                   for c in calls)
    np.testing.assert_array_equal(np.asarray(calls[0]["lengths"]), lengths)
    plain = forward(tiny(attention_dropout=0.0, attention_implementation="xla"), calls,
                    training=True)
    assert [c["implementation"] for c in calls] == ["xla", "xla"]
    real = mask.astype(bool)
    np.testing.assert_allclose(np.asarray(fused)[real], np.asarray(plain)[real], atol=1e-6)


def test_cudnn_off_a_gpu_is_one_line_and_exit_2(tmp_path, capsys):
    argv = ["bertjax.cli.main", "--config=configs/tiny.py", f"--workdir={tmp_path / 'wd'}",
            "--config.model.attention_implementation=cudnn", "--config.model.dtype=bfloat16"]
    assert main.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "needs a GPU" in err[0], err
    assert not (tmp_path / "wd").exists()
