"""The platform a step is compiled for: the devices of the mesh being traced for, which is not
the host's when `python -m bertjax.compile` compiles on a CPU for a TPU slice or a GPU node.
Choices that depend on the hardware (the attention kernel, the bf16 matmul gradients) read it
here, not from `jax.default_backend()`."""

from __future__ import annotations

import jax


def target_platform() -> str:
    """"tpu", "gpu" or "cpu": the devices of the mesh being traced for, else JAX's backend."""
    mesh = jax.sharding.get_abstract_mesh()
    device = None if mesh.empty else getattr(mesh, "abstract_device", None)
    return device.platform if device is not None else jax.default_backend()
