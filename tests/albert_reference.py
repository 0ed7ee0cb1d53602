"""The outside oracle's side of the ALBERT comparisons: transformers' Albert models run on a
padded batch, and our model on the same batch."""

import jax
import numpy as np
import torch

from bertjax.model.config import EncoderConfig
from bertjax.model.encoder import Encoder
from bertjax.model.heads import BertForPretraining

TOL = dict(atol=1e-5, rtol=1e-5)


def padded_batch(vocab: int, seed: int) -> dict:
    """Rows of different lengths, padded with 0, the second a pair of segments."""
    rng = np.random.default_rng(seed)
    lengths = (20, 13, 7)
    ids = np.zeros((len(lengths), max(lengths)), np.int32)
    segments = np.zeros_like(ids)
    for row, length in enumerate(lengths):
        ids[row, :length] = rng.integers(5, vocab, length)
    segments[1, 6:13] = 1
    positions = np.broadcast_to(np.arange(ids.shape[1], dtype=np.int32), ids.shape)
    return {"input_ids": ids, "segment_ids": segments, "input_mask": (ids != 0).astype(np.int32),
            "masked_positions": np.ascontiguousarray(positions)}


def hf_outputs(model, batch):
    tensors = {"input_ids": torch.tensor(batch["input_ids"], dtype=torch.long),
               "token_type_ids": torch.tensor(batch["segment_ids"], dtype=torch.long),
               "attention_mask": torch.tensor(batch["input_mask"])}
    with torch.no_grad():
        return model(**tensors, output_hidden_states=True)


def our_outputs(params, config: EncoderConfig, batch):
    args = (batch["input_ids"], batch["segment_ids"], batch["input_mask"])
    layers = jax.jit(lambda p: Encoder(config, all_layers=True).apply({"params": p}, *args).layers)(
        params["encoder"])
    heads = jax.jit(lambda p: BertForPretraining(config).apply({"params": p}, batch))(params)
    return np.asarray(layers), {k: np.asarray(v) for k, v in heads.items()}
