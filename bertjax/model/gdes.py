"""Gradient-disentangled embedding sharing (GDES; He, Gao and Chen, "DeBERTaV3", 2021): how an
ELECTRA discriminator shares the generator's word table without pulling it two ways.

The generator's MLM loss trains the shared word table E_G (`encoder/embeddings/word_embeddings`);
the discriminator embeds with E_D = stop_gradient(E_G) + E_Δ, where E_Δ (`WORD_DELTA`, a
top-level parameter of the table's shape and sharding) starts at zero and only the replaced
token detection loss trains it. The rest of the embeddings (positions, segments, their
LayerNorm) stay shared as plain ELECTRA shares them.

A checkpoint keeps E_G and E_Δ apart (what training resumes from); every reader of the
discriminator takes `discriminator_view`, whose word table is E_G + E_Δ, and a pretraining run
started from such a view (its init checkpoint) takes `training_params`, E_G and E_Δ apart again.
"""

from __future__ import annotations

from typing import Mapping

import flax.linen as nn
import jax
import numpy as np
from flax.core import meta

from bertjax.model.config import EncoderConfig

Array = jax.Array

WORD_DELTA = "word_embeddings_delta"        # E_Δ, a top-level parameter of the ELECTRA model
GENERATOR_WORDS = "generator_word_embeddings"  # E_G in `discriminator_view`, for the generator


def word_delta(module: nn.Module, config: EncoderConfig) -> Array:
    """Declares E_Δ on `module`: zeros, shaped, typed and sharded as the word table is."""
    init = nn.with_logical_partitioning(nn.initializers.zeros, ("vocab", "embed"))
    return module.param(WORD_DELTA, init, (config.vocab_size, config.embedding_width),
                        config.param_dtype)


def discriminator_words(shared: Array, delta: Array) -> Array:
    """E_D: what the discriminator looks its tokens up in; its loss reaches E_Δ alone."""
    return jax.lax.stop_gradient(shared) + delta


def discriminator_view(params: Mapping) -> Mapping:
    """A checkpoint's parameters as their readers take them. With GDES: `encoder`'s word table
    is E_G + E_Δ (what the discriminator embedded with), E_Δ is gone, and E_G is kept beside as
    `GENERATOR_WORDS` (the generator's table); without GDES, `params` as they are."""
    if WORD_DELTA not in params:
        return params
    params = meta.unbox(params)
    encoder, embeddings = params["encoder"], params["encoder"]["embeddings"]
    shared = np.asarray(embeddings["word_embeddings"])
    merged = np.asarray(discriminator_words(shared, np.asarray(params[WORD_DELTA])))
    view = {name: tree for name, tree in params.items() if name != WORD_DELTA}
    view["encoder"] = {**encoder, "embeddings": {**embeddings, "word_embeddings": merged}}
    view[GENERATOR_WORDS] = shared
    return view


def training_params(view: Mapping, target: Mapping) -> Mapping:
    """`discriminator_view`'s tree for a `target` model that shares by GDES too: `encoder`'s
    word table E_G again and E_Δ the discriminator's table less E_G (to rounding). Any other
    tree, or for another target (BERT's heads, plain ELECTRA: the discriminator's table), as it
    is."""
    if GENERATOR_WORDS not in view or WORD_DELTA not in target:
        return view
    encoder, embeddings = view["encoder"], view["encoder"]["embeddings"]
    shared = np.asarray(view[GENERATOR_WORDS])
    params = {name: tree for name, tree in view.items() if name != GENERATOR_WORDS}
    params["encoder"] = {**encoder, "embeddings": {**embeddings, "word_embeddings": shared}}
    params[WORD_DELTA] = np.asarray(embeddings["word_embeddings"]) - shared
    return params
