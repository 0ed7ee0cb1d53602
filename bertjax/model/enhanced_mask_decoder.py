"""DeBERTa's enhanced mask decoder (He et al., 2021, section 3.3; Microsoft's DeBERTa code,
apps/models/masked_language_model.py `emd_context_layer`): absolute positions, which relative
DeBERTa never adds to its input, enter just before the masked-LM head.

With `hidden` the input of the encoder's last layer and A a learned [max_position_embeddings, H]
table, the query states start as hidden + A[position]; the last layer (its own parameters, no
new ones) is applied `passes` times (the paper's n = 2), each time with its keys and values from
`hidden`, its queries from the current query states (the c2p and p2c terms of query position i
against key position j), and its residual and LayerNorm on the query states. The MLM head reads
the last query states.

A query row depends on no other query row, so the rows are gathered at the P masked positions
first: each pass costs P query rows against L keys, not L against L. The table, parameter
`positions`, lives here, beside the heads: the encoder, its layout and its exports are those of
a run without the decoder, which is a pretraining head only.
"""

from __future__ import annotations

from typing import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.model.attention import AttentionContext
from bertjax.model.config import EncoderConfig
from bertjax.model.encoder import SHARED_LAYER, TransformerLayer
from bertjax.model.primitives import gather_positions, kernel_init

Array = jax.Array


def last_layer_params(config: EncoderConfig, encoder_params: Mapping) -> Mapping:
    """The encoder's last layer's parameters, from its stacked (scanned), looped or shared
    layers."""
    params = nn.meta.unbox(encoder_params)
    if config.share_layers:
        return params[SHARED_LAYER]
    if config.scan_layers:
        return jax.tree.map(lambda stacked: stacked[-1], params["layers"])
    return params[f"layer_{config.num_layers - 1}"]


class EnhancedMaskDecoder(nn.Module):
    """The decoder's query states at the masked positions: [B, P, H] in the compute dtype.
    Parameter: `positions` [max_position_embeddings, H]."""

    config: EncoderConfig
    passes: int

    @nn.compact
    def __call__(self, hidden: Array, ctx: AttentionContext, layer_params: Mapping,
                 masked_positions: Array, positions: Array, deterministic: bool) -> Array:
        """`hidden` [B, L, H] the last layer's input; `ctx` the encoder's (mask, relative
        table); `masked_positions` [B, P] where the query rows stand in the row, `positions`
        [B, P] their position ids (the same, unless documents are packed)."""
        cfg = self.config
        table = self.param("positions", kernel_init(cfg, (None, "embed")),
                           (cfg.max_position_embeddings, cfg.hidden_size), cfg.param_dtype)
        query = (gather_positions(hidden, masked_positions)
                 + jnp.take(table, positions, axis=0).astype(hidden.dtype))
        ctx = ctx.replace(query_positions=masked_positions.astype(jnp.int32))
        layer = TransformerLayer(cfg)
        for _ in range(self.passes):
            # The encoder's own last layer, applied to its parameters as they are: its
            # gradients from these passes add to those of the encoder's pass.
            rngs = {} if deterministic else {"dropout": self.make_rng("dropout")}
            query, _ = layer.apply({"params": layer_params}, hidden, ctx, cfg.num_layers - 1,
                                   deterministic, query, rngs=rngs)
        return query
