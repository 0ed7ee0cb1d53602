"""The least HBM traffic and collective bytes one chip's training step can move, from the model,
the optimizer state and the sharding alone: the byte half of the roofline bound. Every term
counts only what no program for this step can avoid, and each rounds down where a choice
exists, so that the bound is a true minimum (docs/tpu-compile.md writes the model down).

The bound counts only what lives in HBM whatever the program does: the step's inputs and
outputs (a compiled program's arguments and results are HBM buffers). Per chip, with N its
parameter elements (its shard under fsdp/tensor), p the parameters' bytes an element (f32: 4),
c the compute dtype's, S its optimizer state's bytes, L layers, t its tokens:

    optimizer update  2*N*p + 2*S           parameters and state read and written once (the
                                            step's inputs and outputs); the gradients need not
                                            touch HBM (an update fused into the backward pass)
    batch             its arrays, read once
    weights, activations, attention, MLM head  0: a program may keep them in on-chip memory
                                            (a small model's whole working set fits there)

Beside the bound, `spilled` gives what the weights and activations move when they do not fit on
chip (a large model's): weights 2*N*min(p, c), read by the forward and the backward pass;
activations 2*L*t*k*c, the tensors the remat policy saves, written once forward and read once
backward, k elements a token a layer: full H (the layer input), save_dots and none 6H + I (the
input, Q, K, V, attention output, FFN in and out). The report's reconciliation reads them; the
bound does not.

Collectives: the data-parallel shards (data x fsdp, n of them) must sum the gradients: each
chip holds the other n-1 shards' part of the sum, so at least (n-1)/n of its gradient bytes
(N*p) leave it (a ring all-reduce sends twice that; the HLO counts a collective's result).
"""

from __future__ import annotations

import dataclasses
import math

import jax
import numpy as np

from bertjax.model.config import EncoderConfig
from bertjax.parallel import partitioning

CATEGORIES = ("optimizer_update", "weights", "activations", "attention", "mlm_head", "batch")


@dataclasses.dataclass(frozen=True)
class MinimumBytes:
    """One chip's unavoidable bytes a step, by category, and its collective bytes."""
    hbm: dict[str, int]
    collective: int
    sequences: int  # the chip's share of the batch
    spilled: dict[str, int] = dataclasses.field(default_factory=dict)  # not in the bound

    @property
    def hbm_total(self) -> int:
        return sum(self.hbm.values())


def _local(leaf) -> tuple[int, int]:
    """(elements, bytes) of one chip's shard of an abstract array (its sharding, if any)."""
    shape = leaf.shape
    sharding = getattr(leaf, "sharding", None)
    if sharding is not None:
        shape = sharding.shard_shape(shape)
    elements = math.prod(shape)
    return elements, elements * np.dtype(leaf.dtype).itemsize


def saved_per_token(config: EncoderConfig) -> int:
    """Elements a layer's backward pass needs saved a token under the remat policy."""
    h, i = config.hidden_size, config.intermediate_size
    return h if config.remat == "full" else 6 * h + i


def minimum_bytes(state, batch: dict, config: EncoderConfig, mesh, seq_len: int) -> MinimumBytes:
    """The module docstring's model for an abstract train state and batch (shardings
    included) on `mesh`, a phase of `seq_len` tokens."""
    params = [_local(leaf) for leaf in jax.tree.leaves(state.params)]
    elements = sum(n for n, _ in params)
    param_bytes = sum(b for _, b in params)
    opt_state = sum(_local(leaf)[1] for leaf in jax.tree.leaves(state.opt_state)
                    if leaf.shape)  # scalars (step counts) are noise
    compute = np.dtype(config.dtype).itemsize
    per_element = param_bytes / elements if elements else 0
    shards = partitioning.batch_shards(mesh)
    sequences = max(leaf.shape[0] for leaf in jax.tree.leaves(batch)) // shards
    tokens = sequences * seq_len
    tensor = mesh.shape.get("tensor", 1)
    hbm = {
        "optimizer_update": 2 * param_bytes + 2 * opt_state,
        "weights": 0, "activations": 0, "attention": 0, "mlm_head": 0,
        "batch": sum(_local(leaf)[1] for leaf in jax.tree.leaves(batch)),
    }
    spilled = {
        "weights": int(2 * elements * min(per_element, compute)),
        "activations": (2 * config.num_layers * tokens * saved_per_token(config) * compute
                        // tensor),
    }
    collective = (shards - 1) * param_bytes // shards
    return MinimumBytes(hbm, collective, sequences, spilled)
