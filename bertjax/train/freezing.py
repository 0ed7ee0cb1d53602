"""Frozen parameters: an optimizer whose updates to a subtree are zeroed.

A frozen encoder (feature-based fine-tuning) is two things: the model runs the encoder
deterministically under stop_gradient (no backward pass through it), and the optimizer's updates
to its parameters are zeroed here, which also keeps weight decay off them.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import optax


def freeze_encoder(optimizer: optax.GradientTransformation) -> optax.GradientTransformation:
    """`optimizer`, then zero updates for `encoder/...`.

    Zeroing after the whole chain keeps the optimizer state shaped like the parameters (its
    encoder moments stay zero: the model stops the gradient), which the sharded state needs;
    optax.multi_transform would replace them with MaskedNodes.
    """

    def update(updates, state, params=None):
        del params
        return {**updates, "encoder": jax.tree.map(jnp.zeros_like, updates["encoder"])}, state

    zero_encoder = optax.GradientTransformation(lambda _: optax.EmptyState(), update)
    return optax.chain(optimizer, zero_encoder)
