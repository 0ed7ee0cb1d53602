"""The train state, created already sharded: shapes first, then a jitted init with out_shardings.

No parameter is ever materialized whole on one device: `jax.eval_shape` gives the boxed
(logically named) parameter shapes, the rules turn the names into NamedShardings, and the real
initialization runs under `jax.jit(..., out_shardings=...)` so each device computes only its own
shards.
"""

from __future__ import annotations

import math
from typing import Any, Callable, Mapping

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh

from bertjax.parallel import partitioning


@flax.struct.dataclass
class TrainState:
    step: jax.Array  # int32 scalar: optimizer updates applied so far
    params: Any  # unboxed parameter tree
    opt_state: Any
    rng: jax.Array  # base dropout key; each step folds in `step`


def _init_fn(model: nn.Module, optimizer: optax.GradientTransformation,
             example_batch_shapes: Mapping[str, jax.ShapeDtypeStruct], seed: int, *,
             boxed: bool) -> Callable[[], TrainState]:
    """A no-argument function building the state; `boxed` keeps the logical-axis boxes."""

    def init() -> TrainState:
        params_rng, dropout_rng = jax.random.split(jax.random.PRNGKey(seed))
        batch = {key: jnp.zeros(spec.shape, spec.dtype)
                 for key, spec in example_batch_shapes.items()}
        # Traced without the mesh: `out_shardings` alone places the parameters (the forward
        # pass is dead code here), and flax 0.12's DenseGeneral, should a model use it, fails
        # to unbox its flat 2-D kernel under 3-D logical names once constraints are live.
        variables = model.init({"params": params_rng}, batch, deterministic=True)
        params = nn.meta.unbox(variables["params"])
        return TrainState(step=jnp.zeros([], jnp.int32),
                          params=variables["params"] if boxed else params,
                          opt_state=optimizer.init(params), rng=dropout_rng)

    return init


def _state_shardings(boxed_abstract: TrainState, optimizer: optax.GradientTransformation,
                     mesh: Mesh) -> TrainState:
    params = partitioning.param_shardings(boxed_abstract.params, mesh)
    replicated = partitioning.replicated(mesh)
    # Moments that mirror the parameters get the parameters' shardings; counters and other
    # scalars are replicated. A masked optimizer (freezing.train_only) keeps a MaskedNode, no
    # array, in place of a frozen parameter's moments.
    masked = lambda value: isinstance(value, optax.MaskedNode)  # noqa: E731
    opt_state = optax.tree_map_params(
        optimizer, lambda value, sharding: value if masked(value) else sharding,
        boxed_abstract.opt_state, params, transform_non_params=lambda _: replicated,
        is_leaf=masked)
    return TrainState(step=replicated, params=params, opt_state=opt_state, rng=replicated)


def abstract_train_state(model: nn.Module, optimizer: optax.GradientTransformation,
                         example_batch_shapes: Mapping[str, jax.ShapeDtypeStruct], mesh: Mesh,
                         seed: int = 0) -> tuple[TrainState, TrainState]:
    """(ShapeDtypeStruct tree with shardings attached, sharding tree): what a restore needs."""
    boxed = jax.eval_shape(_init_fn(model, optimizer, example_batch_shapes, seed, boxed=True))
    shardings = _state_shardings(boxed, optimizer, mesh)
    unboxed = boxed.replace(params=nn.meta.unbox(boxed.params))
    abstract = jax.tree.map(
        lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding),
        unboxed, shardings)
    return abstract, shardings


def create_train_state(model: nn.Module, optimizer: optax.GradientTransformation,
                       example_batch_shapes: Mapping[str, jax.ShapeDtypeStruct], mesh: Mesh,
                       seed: int) -> tuple[TrainState, TrainState]:
    """A freshly initialized state whose arrays are created directly in their shardings."""
    _, shardings = abstract_train_state(model, optimizer, example_batch_shapes, mesh, seed)
    init = _init_fn(model, optimizer, example_batch_shapes, seed, boxed=False)
    return jax.jit(init, out_shardings=shardings)(), shardings


def param_count(params: Any) -> int:
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(params))
