"""The outside oracle's side of the comparisons: Hugging Face transformers' PyTorch BERT run on
real sentences and the real vocabulary, our model run on the same batch, and a model saved as
transformers saves it."""

import json
import os
import shutil

import jax
import jax.numpy as jnp
import numpy as np
import torch
from transformers import BertForPreTraining

from bertjax.data.tokenizer import WordPieceTokenizer
from bertjax.model.config import EncoderConfig
from bertjax.model.encoder import Encoder
from bertjax.model.heads import BertForPretraining

TOL = dict(atol=1e-5, rtol=1e-5)
PAIRS = [
    ("The quick brown fox jumps over the lazy dog.", "Nobody expected it to be so agile."),
    ("Paris is the capital and most populous city of France.",
     "Its museums attract millions of visitors every year."),
    ("Tokenization splits unbelievably long words into wordpieces.", "Short one."),
    ("Water boils at 100 degrees Celsius at sea level.",
     "At higher altitudes the boiling point is lower, which affects cooking times."),
]


def text_batch(vocab_path: str, *, pairs: bool, predictions: int = 5, seed: int = 0) -> dict:
    """[CLS] A [SEP] (B [SEP]) from real sentences and the real vocabulary, padded, int32."""
    tok = WordPieceTokenizer.from_vocab_file(vocab_path)
    sp = tok.special
    rows = []
    for first, second in PAIRS:
        a, b = tok.encode(first).tolist(), tok.encode(second).tolist()
        ids = [sp.cls, *a, sp.sep] + ([*b, sp.sep] if pairs else [])
        segments = [0] * (len(a) + 2) + ([1] * (len(b) + 1) if pairs else [])
        rows.append((ids, segments))
    length = max(len(ids) for ids, _ in rows) + 3  # every row has padding
    batch = {k: np.zeros((len(rows), length), np.int32)
             for k in ("input_ids", "segment_ids", "input_mask")}
    rng = np.random.default_rng(seed)
    positions = []
    for i, (ids, segments) in enumerate(rows):
        batch["input_ids"][i, :len(ids)] = ids
        batch["segment_ids"][i, :len(ids)] = segments
        batch["input_mask"][i, :len(ids)] = 1
        positions.append(np.sort(rng.choice(np.arange(1, len(ids) - 1), predictions, False)))
    batch["masked_positions"] = np.stack(positions).astype(np.int32)
    assert tok.vocab_size == 30522 and (batch["input_ids"] > 999).mean() > 0.3  # real words
    return batch


def randomize(model: torch.nn.Module, seed: int) -> None:
    """Random values in every parameter: biases and LayerNorms too, so each mapping is tested."""
    torch.manual_seed(seed)
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("LayerNorm.weight"):
                param.uniform_(0.5, 1.5)
            else:
                param.normal_(0.0, 0.1)


def run_ours(params: dict, config: EncoderConfig, batch: dict):
    """(our model's outputs, the encoder's sequence and pooled output) in one jitted call."""
    model = BertForPretraining(config)

    def forward(p, b):
        out, state = model.apply({"params": p}, b, capture_intermediates=lambda m, _: (
            isinstance(m, Encoder)))
        encoded = state["intermediates"]["encoder"]["__call__"][0]
        return out, encoded.sequence, encoded.pooled

    return jax.jit(forward)(params, {k: jnp.asarray(v) for k, v in batch.items()})


def run_hf(model: BertForPreTraining, batch: dict, token_types: bool):
    args = dict(input_ids=torch.from_numpy(batch["input_ids"]).long(),
                attention_mask=torch.from_numpy(batch["input_mask"]).long())
    if token_types:
        args["token_type_ids"] = torch.from_numpy(batch["segment_ids"]).long()
    with torch.no_grad():
        encoded = model.bert(**args)
        out = model(**args)
    mlm = np.take_along_axis(out.prediction_logits.numpy(),
                             batch["masked_positions"][..., None].astype(np.int64), axis=1)
    return (mlm, out.seq_relationship_logits.numpy(), encoded.last_hidden_state.numpy(),
            encoded.pooler_output.numpy())


def save_hf_dir(directory, model, vocab_path, *, lowercase=True):
    """What `save_pretrained` plus a BertTokenizer write: config, weights, vocabulary."""
    model.save_pretrained(directory)
    shutil.copy(vocab_path, os.path.join(directory, "vocab.txt"))
    with open(os.path.join(directory, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "BertTokenizer", "do_lower_case": lowercase}, f)
    return str(directory)
