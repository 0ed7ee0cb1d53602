"""The embeddings: word + learned position + segment tables, LayerNorm and dropout, and the
tied output projection that scores hidden states against the word table."""

from __future__ import annotations

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.core.errors import UserError
from bertjax.model import gdes
from bertjax.model.config import EncoderConfig
from bertjax.model.primitives import dense, kernel_init, layer_norm, matmul

Array = jax.Array
HIDDEN_AXES = ("batch", "length", "embed")


class Embeddings(nn.Module):
    """Word + learned position + segment embeddings, then LayerNorm and dropout. With rotary
    positions there is no position table, and with model.type_vocab_size=0 no segment table;
    model.positions_from_padding numbers positions as RoBERTa does. With model.embedding_size
    (ALBERT) the tables are that wide and `projection` maps the result to the hidden size."""

    config: EncoderConfig

    def setup(self):
        cfg = self.config

        def table(name: str, rows: int, names: tuple) -> Array:
            return self.param(name, kernel_init(cfg, names), (rows, cfg.embedding_width),
                              cfg.param_dtype)

        self.word_embeddings = table("word_embeddings", cfg.vocab_size, ("vocab", "embed"))
        if cfg.position_embedding == "learned":
            self.position_embeddings = table(
                "position_embeddings", cfg.max_position_embeddings, (None, "embed"))
        if cfg.type_vocab_size:
            self.token_type_embeddings = table(
                "token_type_embeddings", cfg.type_vocab_size, (None, "embed"))
        self.layer_norm = layer_norm(cfg, "layer_norm")
        self.dropout = nn.Dropout(cfg.hidden_dropout)
        if cfg.embedding_size:  # ALBERT's embedding_hidden_mapping_in
            self.projection = dense(cfg, cfg.hidden_size, (None, "embed"), "projection")

    def __call__(self, input_ids: Array, segment_ids: Array, deterministic: bool,
                 prompt: Array | None = None, positions: Array | None = None,
                 word_delta: Array | None = None) -> Array:
        """`prompt` [N, H]: soft-prompt vectors that take the word embeddings' place at positions
        1..N (slots the featurization reserved after [CLS]); position and segment embeddings are
        added to them as to any token. `positions` [B, L]: each token's position (packed
        sequences restart at 0); 0..L-1 when not given. `word_delta`: an ELECTRA
        discriminator's E_Δ under GDES (bertjax/model/gdes.py), looked up with the word table."""
        length = input_ids.shape[1]
        if length > self.config.max_sequence_length:
            raise UserError(f"sequence length {length} exceeds the "
                            f"{self.config.max_sequence_length} positions of "
                            f"model.max_position_embeddings {self.config.max_position_embeddings}")
        f32 = jnp.float32
        # Gather the fsdp-sharded hidden dimension before the lookups (as FSDP does for every
        # weight); a gather from a table sharded on its columns makes XLA rematerialize it whole.
        words = self.word_embeddings
        if word_delta is not None:
            words = gdes.discriminator_words(words, word_delta)
        words = nn.with_logical_constraint(words, ("vocab", None))
        word = jnp.take(words, input_ids, axis=0).astype(f32)
        if prompt is not None:
            n = prompt.shape[0]
            if n + 2 > length:
                raise UserError(f"a soft prompt of {n} vectors needs more than {length} positions")
            vectors = jnp.broadcast_to(prompt.astype(f32)[None], (word.shape[0], *prompt.shape))
            word = jnp.concatenate([word[:, :1], vectors, word[:, 1 + n:]], axis=1)
        if self.config.positions_from_padding:
            positions = self._positions_from_padding(input_ids, positions)
        x = self._add_segments_and_positions(word, segment_ids, positions)
        x = self.dropout(self.layer_norm(x), deterministic=deterministic)
        if self.config.embedding_size:
            x = self.projection(x.astype(self.config.dtype))
        return nn.with_logical_constraint(x.astype(self.config.dtype), HIDDEN_AXES)

    def _positions_from_padding(self, input_ids: Array, positions: Array | None) -> Array:
        """RoBERTa's positions (config.positions_from_padding): counted over the row's
        non-padding ids from pad_token_id + 1, padding at pad_token_id. Hugging Face counts
        from the ids, not the attention mask, and so does this. Given positions (packed rows,
        restarting at 0) are shifted by the same offset."""
        pad = self.config.pad_token_id
        if positions is not None:
            return positions + pad + 1
        tokens = (input_ids != pad).astype(jnp.int32)
        return jnp.cumsum(tokens, axis=1) * tokens + pad

    def _add_segments_and_positions(self, x: Array, segment_ids: Array,
                                    positions: Array | None) -> Array:
        """x + segment + position embeddings, in fp32 and in Hugging Face's order."""
        if self.config.type_vocab_size:
            types = nn.with_logical_constraint(self.token_type_embeddings, (None, None))
            x = x + jnp.take(types, segment_ids, axis=0).astype(jnp.float32)
        if self.config.position_embedding == "learned":
            table = nn.with_logical_constraint(self.position_embeddings, (None, None))
            if positions is None:
                x = x + table[None, :x.shape[1]].astype(jnp.float32)
            else:
                x = x + jnp.take(table, positions, axis=0).astype(jnp.float32)
        return x

    def attend(self, x: Array) -> Array:
        """x [..., E] -> fp32 scores [..., V] against the word embeddings (tied output layer; E is
        the hidden size unless the embeddings are factorised)."""
        return matmul("...h,vh->...v", x, self.word_embeddings, self.config, "float32")
