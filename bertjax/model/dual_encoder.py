"""A dual encoder for dense retrieval: queries and documents each become one unit vector (the
last layer pooled, mean or [CLS], then L2-normalized), compared by cosine.

Parameter layout, which `bertjax.load(...).embed` reads as it reads any encoder:

    shared (default)     {"encoder"}                          one encoder for both sides
    separate encoders    {"encoder": the QUERY encoder, "document_encoder"}

so a loaded run embeds with its query encoder; run.json's heads.encoders names the subtree of each
side. The pooler is built (the layout stays a BERT encoder's) but unused.

Batches hold `query_ids`/`query_mask`, `document_ids`/`document_mask` and, when trained with hard
negatives, `negative_ids`/`negative_mask`; outputs are `query`, `document` (and `negative`),
[B, H] fp32 unit vectors. Segment ids are all 0 (one text per row).
"""

from __future__ import annotations

from typing import Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.model import pooling as poolings
from bertjax.model.config import EncoderConfig
from bertjax.model.encoder import Encoder

QUERY_ENCODER = "encoder"
DOCUMENT_ENCODER = "document_encoder"
SIDES = ("query", "document", "negative")  # batch key prefixes and output names


def encoder_names(separate: bool) -> dict[str, str]:
    """Which parameter subtree embeds each side (run.json heads.encoders)."""
    return {"query": QUERY_ENCODER, "document": DOCUMENT_ENCODER if separate else QUERY_ENCODER}


class DualEncoder(nn.Module):
    config: EncoderConfig
    pooling: str = "mean"
    separate: bool = False

    @nn.compact
    def __call__(self, batch: Mapping[str, jax.Array], *, deterministic: bool = True) -> dict:
        query_encoder = Encoder(self.config, name=QUERY_ENCODER)
        document_encoder = (Encoder(self.config, name=DOCUMENT_ENCODER) if self.separate
                            else query_encoder)
        outputs = {}
        for side in SIDES:
            if f"{side}_ids" not in batch:
                continue
            encoder = query_encoder if side == "query" else document_encoder
            ids, mask = batch[f"{side}_ids"], batch[f"{side}_mask"]
            states = encoder(ids, jnp.zeros_like(ids), mask, deterministic=deterministic).sequence
            outputs[side] = poolings.normalized(poolings.pool(states[None], mask, self.pooling))
        return outputs
