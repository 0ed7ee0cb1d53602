"""Who writes an array that every device holds: Orbax splits a large one across the replicas and
writes a small one whole (train/orbax_arrays.py, MIN_REPLICA_SLICE_BYTES); both restore as saved."""

import logging

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import NamedSharding, PartitionSpec

from bertjax.train.checkpoint import Checkpointer
from bertjax.train.orbax_arrays import MIN_REPLICA_SLICE_BYTES


def test_small_replicated_arrays_are_written_whole_and_large_ones_split(tmp_path, caplog):
    mesh = jax.make_mesh((8,), ("data",))
    replicated = NamedSharding(mesh, PartitionSpec())
    rows = 8 * MIN_REPLICA_SLICE_BYTES // (4 * 256)  # float32 x 256 columns: 8 slices of the minimum
    tree = {"small": jax.device_put(jnp.arange(2048.0), replicated),
            "large": jax.device_put(jnp.arange(rows * 256.0).reshape(rows, 256), replicated)}
    jax.config.update("jax_log_compiles", True)
    try:
        with caplog.at_level(logging.WARNING, logger="jax"):
            with Checkpointer(str(tmp_path / "wd"), async_save=False) as checkpointer:
                checkpointer.save(1, tree, {})
    finally:
        jax.config.update("jax_log_compiles", False)
    slices = [r.getMessage() for r in caplog.records
              if r.getMessage().startswith("Compiling jit(slice)")]
    # One slice program per replica of the large array (on its device), none for the small one.
    assert len(slices) == 8 and all(f"float32[{rows},256]" in s for s in slices), slices
    with Checkpointer(str(tmp_path / "wd"), read_only=True) as checkpointer:
        step, restored, _ = checkpointer.restore_latest(
            {k: jax.ShapeDtypeStruct(v.shape, v.dtype, sharding=replicated) for k, v in tree.items()})
    assert step == 1
    for name in tree:
        np.testing.assert_array_equal(restored[name], tree[name])
