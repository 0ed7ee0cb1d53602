"""Frozen parameters: optimizers whose updates to some parameters are zero.

A frozen encoder (feature-based fine-tuning) is two things: the model runs the encoder
deterministically under stop_gradient (no backward pass through it), and the optimizer's updates
to its parameters are zeroed here, which also keeps weight decay off them.

Parameter-efficient methods (adapters, LoRA) freeze the base weights *inside* the encoder while
gradients flow through it to the new parameters: `train_only` gives the optimizer (and its state)
the trainable parameters alone, and `stop_frozen_gradients` lets the train step skip the frozen
weights' gradients.
"""

from __future__ import annotations

from typing import Any, Callable

import jax
import jax.numpy as jnp
import optax

Trains = Callable[[str], bool]  # '/'-joined parameter path -> whether it trains
TRAIN, FROZEN = "train", "frozen"


def freeze_encoder(optimizer: optax.GradientTransformation) -> optax.GradientTransformation:
    """`optimizer`, then zero updates for `encoder/...`.

    Zeroing after the whole chain keeps the optimizer state shaped like the parameters (its
    encoder moments stay zero: the model stops the gradient), which checkpoints of this mode
    already hold; `train_only` is the memory-saving form.
    """

    def update(updates, state, params=None):
        del params
        return {**updates, "encoder": jax.tree.map(jnp.zeros_like, updates["encoder"])}, state

    zero_encoder = optax.GradientTransformation(lambda _: optax.EmptyState(), update)
    return optax.chain(optimizer, zero_encoder)


def path_name(path) -> str:
    return "/".join(str(getattr(key, "key", getattr(key, "name", key))) for key in path)


def labels(params: Any, trains: Trains) -> Any:
    return jax.tree_util.tree_map_with_path(
        lambda path, _: TRAIN if trains(path_name(path)) else FROZEN, params)


def train_only(optimizer: optax.GradientTransformation,
               trains: Trains) -> optax.GradientTransformation:
    """`optimizer` on the parameters `trains` accepts, zero updates for the others.

    optax.multi_transform keeps no state for the frozen ones (optax.MaskedNode in their place),
    so the moments of a frozen base model cost no memory and are not checkpointed."""
    return optax.multi_transform({TRAIN: optimizer, FROZEN: optax.set_to_zero()},
                                 lambda params: labels(params, trains))


def stop_frozen_gradients(params: Any, trains: Trains) -> Any:
    """The frozen parameters under stop_gradient: their gradients are zeros that XLA never
    computes (and that the reported gradient norm does not count)."""
    return jax.tree_util.tree_map_with_path(
        lambda path, p: p if trains(path_name(path)) else jax.lax.stop_gradient(p), params)
