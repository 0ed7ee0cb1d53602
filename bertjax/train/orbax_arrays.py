"""How Orbax writes a jax.Array: which replicated arrays it splits into per-replica slices."""

from __future__ import annotations

import functools

import jax
import orbax.checkpoint as ocp
# Orbax's default array handler keeps array metadata in this store, which has no public name.
from orbax.checkpoint._src.metadata import array_metadata_store

# Orbax splits the write of an array replicated over R devices into R slices, one per replica,
# each a separately compiled slice program (per shape and offset) and transfer: for the many
# small arrays of a model (biases, LayerNorms, a tiny model's everything) that costs more than it
# saves. Orbax already turns splitting off on GPUs; here it is kept for slices of 1 MiB and up
# (for a small model over 8 CPU devices: about half the compiled programs, and several times
# faster saves).
MIN_REPLICA_SLICE_BYTES = 1 << 20


@functools.cache
def split_only_large_arrays() -> None:
    """Orbax's array handler (process-wide, as Orbax keeps it) with MIN_REPLICA_SLICE_BYTES."""
    handler = ocp.type_handlers.ArrayHandler(
        min_slice_bytes_for_replica_parallel=MIN_REPLICA_SLICE_BYTES,
        array_metadata_store=array_metadata_store.Store())  # as Orbax's default handler has
    ocp.type_handlers.register_type_handler(jax.Array, handler, override=True)
