"""Prompt-based heads: soft prompt vectors (Lester et al., 2021) and cloze scoring through the
pretrained MLM head (Schick & Schuetze's PET).

    SoftPrompt        {"soft_prompt": {"embeddings" [N, H]}}: N trainable vectors that take the
                      word embeddings' place at positions 1..N, right after [CLS]
    ClozeClassifier   {"encoder", "mlm" (+ "soft_prompt")}: the MLM head (BertForPretraining's
                      `mlm`, tied to the word embeddings) at each row's [MASK]; `logits` [B, C] are
                      its scores of the C verbalizer tokens

The prompt goes after [CLS] rather than before it so that position 0 stays [CLS]: the pooler and
the classification head read it there as they were pretrained to, and the text keeps its usual
neighbour. Its slots are reserved by the featurization (placeholder ids with input_mask 1), so
positions, masks and max_seq_len need no special case: the prompt takes N of the max_seq_len
positions.

With a soft prompt the encoder is frozen through its parameters, not its outputs: gradients must
flow through the encoder to the prompt, but none reach the encoder's own weights
(`frozen_encoder`), so they are exactly zero and gradient clipping sees only what trains.
"""

from __future__ import annotations

from typing import Mapping

import flax.linen as nn
import jax
import numpy as np

from bertjax.model.config import EncoderConfig
from bertjax.model.encoder import Encoder, EncoderOutput
from bertjax.model.primitives import gather_positions, kernel_init
from bertjax.model.heads import MaskedLmHead

Array = jax.Array
PROMPT = "soft_prompt"  # the prompt's top-level parameter name
INIT_WORDS = 5000  # the prompt starts as embeddings of words drawn from the first 5,000


class SoftPrompt(nn.Module):
    config: EncoderConfig
    length: int

    @nn.compact
    def __call__(self) -> Array:
        cfg = self.config
        return self.param("embeddings", kernel_init(cfg, (None, "embed")),
                          (self.length, cfg.embedding_width), cfg.param_dtype)


def _stop_gradient(tree):
    return jax.tree.map(jax.lax.stop_gradient, tree)


# The encoder with stop_gradient on every parameter as it is read (the tied output projection
# `attend` included): no gradient reaches it, while activations still carry one to the prompt.
FrozenEncoder = nn.map_variables(Encoder, "params", _stop_gradient, init=True,
                                 methods=["__call__", "attend"])


def encode(config: EncoderConfig, batch: Mapping[str, Array], deterministic: bool,
           prompt_length: int) -> tuple[EncoderOutput, nn.Module]:
    """(encoder output, encoder module); with `prompt_length` > 0 a SoftPrompt feeds a frozen
    encoder."""
    if prompt_length:
        prompt = SoftPrompt(config, prompt_length, name=PROMPT)()
        encoder = FrozenEncoder(config, name="encoder")
    else:
        prompt, encoder = None, Encoder(config, name="encoder")
    encoded = encoder(batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                      deterministic=deterministic, prompt=prompt)
    return encoded, encoder


class ClozeClassifier(nn.Module):
    """Outputs `logits` [B, C]: the MLM head's logits of `verbalizer_ids` at `mask_position`."""

    config: EncoderConfig
    verbalizer_ids: tuple[int, ...]
    prompt_length: int = 0

    @nn.compact
    def __call__(self, batch: Mapping[str, Array], *, deterministic: bool = True) -> dict:
        cfg = self.config
        encoded, encoder = encode(cfg, batch, deterministic, self.prompt_length)
        hidden = gather_positions(encoded.sequence, batch["mask_position"][:, None])  # [B, 1, H]
        vocabulary = MaskedLmHead(cfg, name="mlm")(hidden, encoder.attend)[:, 0]  # [B, V] fp32
        return {"logits": vocabulary[:, np.asarray(self.verbalizer_ids, np.int32)]}


def prompt_token_ids(tokens: list[str], special: set[int], length: int, seed: int) -> np.ndarray:
    """`length` ids of whole words among the first INIT_WORDS of the vocabulary (`tokens`, in id
    order), drawn without replacement by `seed`: Lester et al.'s "sampled vocabulary" start,
    which they found to train better than random vectors (the prompt then lies where the embedding
    LayerNorm expects words)."""
    # Whole words: no "##" continuation, no [unused] slot; SentencePiece's word marker ignored.
    words = [i for i, t in enumerate(tokens)
             if i not in special and t.lstrip("\u2581").isalpha()][:INIT_WORDS]
    if not words:
        words = [i for i in range(len(tokens)) if i not in special]
    rng = np.random.default_rng(seed)
    return np.asarray(rng.choice(words, size=length, replace=length > len(words)), np.int32)
