"""The jitted, sharded, donated train step and the eval step.

`train_step(state, batch)` is a pure function of its inputs: the dropout key is derived from the
state's key and step, so replaying a step after a restore gives bit-identical results.
"""

from __future__ import annotations

from typing import Any, Callable, Mapping

import flax.linen as nn
import jax
import jax.numpy as jnp
import optax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bertjax.core.errors import UserError
from bertjax.parallel import partitioning
from bertjax.train import freezing, objectives
from bertjax.train.optimizer import applied_learning_rate
from bertjax.train.state import TrainState

Batch = Mapping[str, jax.Array]
Metrics = dict[str, jax.Array]


def _split_micro_batches(batch: Batch, count: int, mesh: Mesh) -> dict[str, jax.Array]:
    """[B, ...] -> [count, B / count, ...], micro-batch i holding rows i, i + count, ...

    Each device's contiguous block of rows holds rows of every micro-batch, so every
    micro-batch stays spread over all batch shards and the split moves no data.
    """
    rows = next(iter(batch.values())).shape[0]
    shards = partitioning.batch_shards(mesh)
    if rows % count or (rows // count) % shards:
        raise UserError(f"batch size {rows} must split into {count} accumulation steps of a "
                        f"multiple of the {shards} data x fsdp shards")
    spread = NamedSharding(mesh, PartitionSpec(None, partitioning.BATCH_AXES))

    def split(x: jax.Array) -> jax.Array:
        x = x.reshape(rows // count, count, *x.shape[1:]).swapaxes(0, 1)
        return jax.lax.with_sharding_constraint(x, spread)

    return {key: split(value) for key, value in batch.items()}


def _loss_and_grads(model: nn.Module, mesh: Mesh, param_shardings: Any,
                    objective: objectives.StepObjective,
                    trains: freezing.Trains | None = None) -> Callable:
    """(params, batch, dropout key, normalizers) -> (loss, metric sums), grads."""

    def loss_fn(params, batch, dropout_rng, normalizers):
        if trains is not None:
            params = freezing.stop_frozen_gradients(params, trains)
        with partitioning.axis_rules(mesh):
            outputs = model.apply({"params": params}, batch, deterministic=False,
                                  rngs={"dropout": dropout_rng})
        sums = objective.metric_sums(outputs, batch)
        return objective.loss_from_sums(sums, normalizers), sums

    grad_fn = jax.value_and_grad(loss_fn, has_aux=True)

    def loss_and_grads(params, batch, dropout_rng, normalizers):
        (loss, sums), grads = grad_fn(params, batch, dropout_rng, normalizers)
        # Keep gradients (and the accumulation carry) in the parameters' shardings.
        return (loss, sums), jax.lax.with_sharding_constraint(grads, param_shardings)

    return loss_and_grads


def make_train_step(model: nn.Module, optimizer: optax.GradientTransformation, mesh: Mesh,
                    state_shardings: TrainState, *, accumulation_steps: int = 1,
                    objective: objectives.StepObjective = objectives.PRETRAINING,
                    trains: freezing.Trains | None = None) -> Callable:
    """jit(train_step): (state, batch) -> (new state, metrics); the old state is donated.

    `trains` (parameter path -> bool): the others get no gradient (freezing.train_only is the
    optimizer that goes with it).

    With accumulation the batch is split into micro-batches inside the step (lax.scan) and one
    update is made. Each micro-batch's loss divides by the WHOLE batch's weights (total MLM
    weight, example count), so the summed micro-batch gradients are exactly the whole-batch
    gradient. Dropout differs: each micro-batch draws its own key.

    Metrics (replicated device scalars): the objective sums, `loss` (whole batch),
    `grad_norm` (before clipping) and `learning_rate` (the one this update applied).
    """
    if accumulation_steps < 1:
        raise UserError(f"accumulation_steps must be >= 1, got {accumulation_steps}")
    loss_and_grads = _loss_and_grads(model, mesh, state_shardings.params, objective, trains)

    def accumulate(params, batch, step_rng, normalizers):
        micro_batches = _split_micro_batches(batch, accumulation_steps, mesh)
        first = jax.tree.map(lambda x: x[0], micro_batches)
        (_, sums_shape), grads_shape = jax.eval_shape(
            loss_and_grads, params, first, step_rng, normalizers)
        zeros = jax.tree.map(lambda s: jnp.zeros(s.shape, s.dtype), (sums_shape, grads_shape))

        def body(carry, xs):
            index, micro_batch = xs
            (_, sums), grads = loss_and_grads(
                params, micro_batch, jax.random.fold_in(step_rng, index), normalizers)
            return jax.tree.map(jnp.add, carry, (sums, grads)), None

        indices = jnp.arange(accumulation_steps)
        (sums, grads), _ = jax.lax.scan(body, zeros, (indices, micro_batches))
        return sums, grads

    def train_step(state: TrainState, batch: Batch) -> tuple[TrainState, Metrics]:
        step_rng = jax.random.fold_in(state.rng, state.step)
        normalizers = objective.batch_normalizers(batch)
        if accumulation_steps == 1:
            (_, sums), grads = loss_and_grads(state.params, batch, step_rng, normalizers)
        else:
            sums, grads = accumulate(state.params, batch, step_rng, normalizers)
        updates, opt_state = optimizer.update(grads, state.opt_state, state.params)
        new_state = state.replace(step=state.step + 1,
                                  params=optax.apply_updates(state.params, updates),
                                  opt_state=opt_state)
        metrics = {**sums, "loss": objective.loss_from_sums(sums),
                   "grad_norm": optax.tree.norm(grads),
                   "learning_rate": applied_learning_rate(opt_state)}
        return new_state, metrics

    return jax.jit(train_step,
                   in_shardings=(state_shardings, partitioning.batch_sharding(mesh)),
                   out_shardings=(state_shardings, partitioning.replicated(mesh)),
                   # keep_unused: jit would drop state leaves the step never reads (the last
                   # learning rate), and a dropped argument is not donated.
                   donate_argnums=0, keep_unused=True)


def make_eval_step(model: nn.Module, mesh: Mesh, state_shardings: TrainState, *,
                   objective: objectives.StepObjective = objectives.PRETRAINING) -> Callable:
    """jit(eval_step): (params, batch) -> metric sums (replicated), deterministic forward."""

    def eval_step(params: Any, batch: Batch) -> Metrics:
        with partitioning.axis_rules(mesh):
            outputs = model.apply({"params": params}, batch, deterministic=True)
        return objective.metric_sums(outputs, batch)

    return jax.jit(eval_step,
                   in_shardings=(state_shardings.params, partitioning.batch_sharding(mesh)),
                   out_shardings=partitioning.replicated(mesh))


def make_predict_step(model: nn.Module, mesh: Mesh, state_shardings: TrainState) -> Callable:
    """jit(predict_step): (params, batch) -> the model's outputs, deterministic forward.

    For metrics that need every prediction (F1, correlations, span decoding) rather than sums;
    outputs come back replicated so each host can read them whole.
    """

    def predict_step(params: Any, batch: Batch) -> Any:
        with partitioning.axis_rules(mesh):
            return model.apply({"params": params}, batch, deterministic=True)

    return jax.jit(predict_step,
                   in_shardings=(state_shardings.params, partitioning.batch_sharding(mesh)),
                   out_shardings=partitioning.replicated(mesh))
