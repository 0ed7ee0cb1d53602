"""Bidirectional attention through JAX's Pallas splash attention kernel (TPU), forward and
backward, for global layers (a full mask) and sliding-window layers (a local mask).

What may be seen reaches the kernel as segment ids: a real token's is its pack id + 1 (0 without
packing), padding's is 0, which no real token has; padding then attends only to padding, and no
row is empty (the kernel's softmax needs one key a row). Those rows differ from the XLA path's
(where padding sees nothing and averages every key), and only those.

The kernel takes lengths in whole blocks of 128: the row is padded to a multiple of 128 (as
padding). Head sizes of 64 (BERT's, ModernBERT's) and 128 compile for a TPU as they are. Queries
are scaled by 1/sqrt(D) first (the kernel does not scale).

Under a mesh (the train step's, partitioning.axis_rules) the kernel runs in `shard_map`: rows
over (data, fsdp), heads over tensor, as MaxText runs it; a Pallas call has no sharding rule of
its own for the partitioner.
"""

from __future__ import annotations

import functools
import math

import jax
import jax.numpy as jnp
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_kernel as splash
from jax.experimental.pallas.ops.tpu.splash_attention import splash_attention_mask as masks
from jax.sharding import PartitionSpec

from bertjax.parallel.partitioning import BATCH_AXES

Array = jax.Array

LANES = 128  # the kernel's block lengths are multiples of this
GLOBAL_BLOCK = 512  # MaxText's block for full attention; 128 for windows (fewer wasted keys)
HEADS_AXIS = "tensor"


def padded_length(length: int) -> int:
    return -(-length // LANES) * LANES


def block_size(length: int, half_window: int | None) -> int:
    """The largest of 512, 256, 128 dividing the padded length (128 for a window)."""
    padded = padded_length(length)
    if half_window is not None:
        return LANES
    return next(b for b in (GLOBAL_BLOCK, 256, LANES) if padded % b == 0)


def segment_ids(key_mask: Array, pack_ids: Array | None) -> Array:
    """int32 [B, L]: pack id + 1 at real tokens (1 without packing), 0 at padding."""
    real = jnp.ones_like(key_mask, jnp.int32) if pack_ids is None else pack_ids.astype(
        jnp.int32) + 1
    return jnp.where(key_mask, real, 0)


def splash_attention(query: Array, key: Array, value: Array, key_mask: Array,
                     pack_ids: Array | None = None, *, half_window: int | None = None,
                     interpret: bool = False, heads_major: bool = False) -> Array:
    """Attention of [B, L, N, D] queries over keys of their own sequence, not padding and, with
    `half_window`, within that many positions. Returns [B, L, N, D] in value's dtype, or the
    kernel's own [B, N, L, D] with `heads_major`: a consumer that contracts that layout keeps
    the kernel's output (saved for its backward pass anyway) as its own residual, not a copy."""
    batch, length, heads, dim = query.shape
    padded = padded_length(length)
    scale = 1.0 / math.sqrt(dim)
    query = (query.astype(jnp.float32) * scale).astype(query.dtype)

    def to_kernel(x: Array) -> Array:
        """[B, L, N, D] -> [B, N, Lp, D], zero padded."""
        x = jnp.pad(x, [(0, 0), (0, padded - length), (0, 0), (0, 0)])
        return x.transpose(0, 2, 1, 3)

    ids = jnp.pad(segment_ids(key_mask, pack_ids), [(0, 0), (0, padded - length)])
    run = functools.partial(_kernel_call, half_window=half_window, interpret=interpret,
                            block=block_size(length, half_window))
    args = (to_kernel(query), to_kernel(key), to_kernel(value), ids)
    out = _sharded(run, args, batch, heads)
    out = out[:, :, :length].astype(value.dtype)
    return out if heads_major else out.transpose(0, 2, 1, 3)


def _kernel_call(query: Array, key: Array, value: Array, ids: Array, *,
                 half_window: int | None, interpret: bool, block: int) -> Array:
    """The kernel over [b, n, Lp, D] (one shard's rows and heads), vmapped over rows."""
    _, heads, length, _ = query.shape
    shape = (length, length)
    head_mask = (masks.FullMask(shape) if half_window is None
                 else masks.LocalMask(shape, (half_window, half_window), offset=0))
    sizes = splash.BlockSizes(block_q=block, block_kv=block, block_kv_compute=block,
                              block_q_dkv=block, block_kv_dkv=block,
                              block_kv_dkv_compute=block, block_q_dq=block, block_kv_dq=block)
    kernel = splash.make_splash_mha(masks.MultiHeadMask([head_mask] * heads),
                                    block_sizes=sizes, head_shards=1, q_seq_shards=1,
                                    interpret=interpret)

    def one_row(q, k, v, row_ids):
        return kernel(q, k, v, segment_ids=splash.SegmentIds(q=row_ids, kv=row_ids))

    return jax.vmap(one_row)(query, key, value, ids)


def _sharded(run, args: tuple, batch: int, heads: int) -> Array:
    """`run` directly, or per shard in shard_map when a mesh is being traced for."""
    mesh = jax.sharding.get_abstract_mesh()
    if mesh.empty:
        return run(*args)
    sizes = dict(mesh.shape)
    rows = tuple(axis for axis in BATCH_AXES if axis in sizes)
    if batch % math.prod(sizes[axis] for axis in rows):
        rows = ()  # e.g. a batch smaller than the mesh: every shard computes every row
    head_axis = HEADS_AXIS if HEADS_AXIS in sizes and heads % sizes[HEADS_AXIS] == 0 else None
    spec = PartitionSpec(rows or None, head_axis, None, None)
    # check_vma off: the Pallas call declares no varying-axes rule.
    return jax.shard_map(run, mesh=mesh, in_specs=(spec, spec, spec, PartitionSpec(rows or None)),
                         out_specs=spec, check_vma=False)(*args)
