"""Abstract fine-tuning batches laid out over a mesh, to compile a step without data."""

import jax
import numpy as np

from bertjax.parallel import partitioning


def batch_shapes(mesh, rows=8, length=8, **extra):
    sharding = partitioning.batch_sharding(mesh)
    spec = {"input_ids": np.int32, "segment_ids": np.int32, "input_mask": np.int32,
            "label": np.int32, "weight": np.float32, **extra}
    return {k: jax.ShapeDtypeStruct((rows, length) if k.startswith(("input", "segment"))
                                    else (rows,), v, sharding=sharding) for k, v in spec.items()}
