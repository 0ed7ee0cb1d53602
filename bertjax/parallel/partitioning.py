"""Logical axis names -> mesh axes: one rules table, parameter and batch shardings.

Model code names the dimensions of its parameters and activations ("embed", "mlp", "batch", ...);
the RULES table below maps those names to the (data, fsdp, tensor) mesh axes. Flax resolves a
spec left to right in RULES order and never uses a mesh axis twice in one spec, so "batch" is
listed before "embed": an activation ("batch", "length", "embed") shards its batch over
(data, fsdp) and leaves "embed" whole, while a parameter ("vocab", "embed") has no batch dimension
and gets fsdp on "embed" (FSDP / ZeRO-3 style) and tensor on "vocab".
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from typing import Any, Iterator, Mapping, Sequence

import flax.linen as nn
import jax
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from bertjax.core.errors import UserError

LogicalRules = Sequence[tuple[str, Any]]

BATCH_AXES = ("data", "fsdp")

RULES: LogicalRules = (
    ("batch", BATCH_AXES),
    ("vocab", "tensor"),
    ("heads", "tensor"),
    ("mlp", "tensor"),
    ("embed", "fsdp"),
    ("kv", None),
    ("length", None),
    ("norm", None),
    ("layers", None),
)


@contextlib.contextmanager
def axis_rules(mesh: Mesh, rules: LogicalRules = RULES) -> Iterator[None]:
    """Makes the model's logical sharding constraints take effect while it is traced.

    Flax applies `with_logical_constraint` only when an (abstract) mesh is set; the abstract mesh
    may be entered inside `jax.jit` tracing, unlike `jax.set_mesh`.
    """
    with jax.sharding.use_abstract_mesh(mesh.abstract_mesh), nn.logical_axis_rules(rules):
        yield


def _divisible_spec(spec: PartitionSpec, shape: Sequence[int], mesh: Mesh) -> PartitionSpec:
    # A dimension the mesh axes do not divide (e.g. BERT's 30,522-token vocabulary over 4 tensor
    # shards) is kept whole rather than failing: uneven parameter shards are not allowed.
    axes = []
    for dim, entry in zip(shape, tuple(spec) + (None,) * (len(shape) - len(spec))):
        names = () if entry is None else (entry,) if isinstance(entry, str) else tuple(entry)
        shards = math.prod(mesh.shape[name] for name in names)
        axes.append(entry if shards > 1 and dim % shards == 0 else None)
    return PartitionSpec(*axes)


def param_shardings(abstract_boxed_variables: Any, mesh: Mesh,
                    rules: LogicalRules = RULES) -> Any:
    """NamedShardings for a tree of (possibly) `nn.LogicallyPartitioned` values.

    The result matches the UNBOXED tree (`nn.meta.unbox`); leaves without logical names are
    replicated.
    """
    logical_specs = nn.get_partition_spec(abstract_boxed_variables)
    mesh_specs = nn.logical_to_mesh(logical_specs, rules)
    shapes = nn.meta.unbox(abstract_boxed_variables)
    return jax.tree.map(
        lambda spec, leaf: NamedSharding(mesh, _divisible_spec(spec, leaf.shape, mesh)),
        mesh_specs, shapes, is_leaf=lambda x: isinstance(x, PartitionSpec))


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Leading (example) axis split over data x fsdp; the rest whole."""
    return NamedSharding(mesh, PartitionSpec(BATCH_AXES))


def replicated(mesh: Mesh) -> NamedSharding:
    return NamedSharding(mesh, PartitionSpec())


def batch_shards(mesh: Mesh) -> int:
    """How many pieces the global batch is split into (its size must be a multiple)."""
    return math.prod(mesh.shape[name] for name in BATCH_AXES)


@dataclasses.dataclass(frozen=True)
class BatchSlice:
    """Which rows of each global batch this process feeds.

    The global batch is `count` equal blocks of rows and this process feeds block `index`
    (`count` is the process count when data x fsdp spans every process; smaller when processes
    hold replicas, e.g. tensor parallelism across hosts, and then replicas feed the same rows).
    `contiguous`: the process's devices hold exactly the rows [index * n, (index + 1) * n), so
    the global batch is row for row the one a single process would build. When a mesh places a
    process's devices at scattered batch positions (possible on TPU pod topologies), JAX puts
    its rows there in order: the same examples, in another order within the batch.
    """

    index: int
    count: int
    contiguous: bool


@functools.lru_cache(maxsize=32)  # read once per step otherwise
def process_batch_slice(mesh: Mesh) -> BatchSlice:
    """This process's share of every global batch, read off the batch sharding."""
    shards = batch_shards(mesh)
    # One row per batch shard: device -> the rows (shards) it holds.
    indices = batch_sharding(mesh).devices_indices_map((shards,))
    rows_of: dict[int, set[int]] = {}
    for device, index in indices.items():
        start, stop, _ = index[0].indices(shards)
        rows_of.setdefault(device.process_index, set()).update(range(start, stop))
    return slice_of_rows(rows_of, jax.process_index(), shards)


def slice_of_rows(rows_of: Mapping[int, set[int]], process: int, shards: int) -> BatchSlice:
    """The BatchSlice of `process` given every process's batch rows (out of `shards`)."""
    distinct = sorted({tuple(sorted(rows)) for rows in rows_of.values()})
    mine = tuple(sorted(rows_of[process]))
    sizes = {len(rows) for rows in distinct}
    covered = sorted(row for rows in distinct for row in rows)
    if len(sizes) != 1 or covered != list(range(shards)):
        raise UserError(f"the mesh gives processes unequal or overlapping parts of the batch "
                        f"({dict(rows_of)}): choose mesh sizes whose data x fsdp axes split "
                        "evenly over the processes")
    index = distinct.index(mine)
    contiguous = mine == tuple(range(index * len(mine), (index + 1) * len(mine)))
    return BatchSlice(index=index, count=len(distinct), contiguous=contiguous)


def global_batch(local_batch: Mapping[str, np.ndarray], mesh: Mesh) -> dict[str, jax.Array]:
    """Builds global arrays from this process's rows: its `process_batch_slice(mesh)` block."""
    sharding = batch_sharding(mesh)
    rows = {key: np.shape(value)[0] for key, value in local_batch.items()}
    if len(set(rows.values())) > 1:
        raise UserError(f"batch fields have different numbers of rows: {rows}")
    local_rows = next(iter(rows.values()), 0)
    global_rows = local_rows * process_batch_slice(mesh).count
    if global_rows % batch_shards(mesh):
        raise UserError(f"global batch size {global_rows} is not divisible by the "
                        f"{batch_shards(mesh)} data x fsdp shards of the mesh")
    # One call for every field: one batched transfer each step, not one per field.
    local = {key: np.asarray(value) for key, value in local_batch.items()}
    return jax.make_array_from_process_local_data(
        sharding, local, {key: (global_rows, *value.shape[1:]) for key, value in local.items()})
