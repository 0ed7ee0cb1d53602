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
import numpy as np
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
             example_batch_shapes: Mapping[str, jax.ShapeDtypeStruct]
             ) -> Callable[[jax.Array], TrainState]:
    """A function of the seed's PRNG key building the state, its parameters in their
    logical-axis boxes."""

    def init(seed_key: jax.Array) -> TrainState:
        params_rng, dropout_rng = jax.random.split(seed_key)
        batch = {key: jnp.zeros(spec.shape, spec.dtype)
                 for key, spec in example_batch_shapes.items()}
        # Traced without the mesh: `out_shardings` alone places the parameters (the forward
        # pass is dead code here), and flax 0.12's DenseGeneral, should a model use it, fails
        # to unbox its flat 2-D kernel under 3-D logical names once constraints are live.
        variables = model.init({"params": params_rng}, batch, deterministic=True)
        return TrainState(step=jnp.zeros([], jnp.int32), params=variables["params"],
                          opt_state=optimizer.init(nn.meta.unbox(variables["params"])),
                          rng=dropout_rng)

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


class StatePlan:
    """A state's shapes and shardings, and the jitted init that creates it in them.

    The init is traced once: `jax.eval_shape` gives the boxed (logically named) shapes, and the
    jitted init is the same function, so jit finds that trace cached (tracing a model's init
    is a tenth of a second even for the tiny preset).
    """

    def __init__(self, model: nn.Module, optimizer: optax.GradientTransformation,
                 example_batch_shapes: Mapping[str, jax.ShapeDtypeStruct], mesh: Mesh,
                 seed: int = 0):
        self._init = _init_fn(model, optimizer, example_batch_shapes)
        # The key is an argument, not a constant of the program: runs that differ only in their
        # seed (restarts, a benchmark's seeds) compile one initialization between them.
        self._key = np.asarray(jax.random.PRNGKey(seed))
        self._replicated = partitioning.replicated(mesh)
        boxed = jax.eval_shape(self._init, jax.ShapeDtypeStruct(self._key.shape, self._key.dtype))
        self.shardings = _state_shardings(boxed, optimizer, mesh)
        # The shardings laid over the boxed tree: a box is a pytree node over its value.
        self._boxed_shardings = jax.tree.unflatten(jax.tree.structure(boxed),
                                                   jax.tree.leaves(self.shardings))
        self.abstract = jax.tree.map(
            lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype,
                                                        sharding=sharding),
            boxed.replace(params=nn.meta.unbox(boxed.params)), self.shardings)

    def init_program(self) -> jax.stages.Lowered:
        """The initialization, lowered for these shapes and shardings: one program whatever the
        seed."""
        return jax.jit(self._init, in_shardings=self._replicated,
                       out_shardings=self._boxed_shardings).lower(self._key)

    def create(self) -> TrainState:
        """A freshly initialized state whose arrays are created directly in their shardings."""
        state = self.init_program().compile()(self._key)
        return state.replace(params=nn.meta.unbox(state.params))


def abstract_train_state(model: nn.Module, optimizer: optax.GradientTransformation,
                         example_batch_shapes: Mapping[str, jax.ShapeDtypeStruct], mesh: Mesh,
                         seed: int = 0) -> tuple[TrainState, TrainState]:
    """(ShapeDtypeStruct tree with shardings attached, sharding tree): what a restore needs."""
    plan = StatePlan(model, optimizer, example_batch_shapes, mesh, seed)
    return plan.abstract, plan.shardings


def create_train_state(model: nn.Module, optimizer: optax.GradientTransformation,
                       example_batch_shapes: Mapping[str, jax.ShapeDtypeStruct], mesh: Mesh,
                       seed: int) -> tuple[TrainState, TrainState]:
    """A freshly initialized state whose arrays are created directly in their shardings."""
    plan = StatePlan(model, optimizer, example_batch_shapes, mesh, seed)
    return plan.create(), plan.shardings


def param_count(params: Any) -> int:
    return sum(math.prod(leaf.shape) for leaf in jax.tree.leaves(params))
