"""The device mesh: (data, fsdp, tensor) axes from per-axis sizes.

This is the only module that asks JAX which devices exist; everything else receives a Mesh.
"""

from __future__ import annotations

import math
from typing import Sequence

import jax
from jax.experimental import mesh_utils
from jax.sharding import AxisType, Mesh

from bertjax.core.errors import UserError

AXES = ("data", "fsdp", "tensor")


def resolve_axis_sizes(sizes: Sequence[int], device_count: int) -> tuple[int, ...]:
    """Fills in the one -1 (if any) and checks that the sizes use exactly `device_count` devices."""
    named = ", ".join(f"{axis}={size}" for axis, size in zip(AXES, sizes))
    if any(size == 0 or size < -1 for size in sizes):
        raise UserError(f"mesh sizes must be positive or -1, got {named}")
    free = [i for i, size in enumerate(sizes) if size == -1]
    if len(free) > 1:
        raise UserError(f"at most one mesh size may be -1, got {named}")
    fixed = math.prod(size for size in sizes if size != -1)
    resolved = list(sizes)
    if free:
        if device_count % fixed:
            raise UserError(f"mesh {named}: the fixed sizes multiply to {fixed}, which does not "
                            f"divide the {device_count} devices")
        resolved[free[0]] = device_count // fixed
    if math.prod(resolved) != device_count:
        raise UserError(f"mesh {named} needs {math.prod(resolved)} devices but there are "
                        f"{device_count}")
    return tuple(resolved)


def first_devices(count: int, devices=None) -> list:
    """The first `count` of `devices` (default: all of them, across every host); -1: all.

    A subset serves one process only: across several hosts each would have to hold a share of it,
    which a count taken from the front of the list cannot promise."""
    devices = list(jax.devices() if devices is None else devices)
    if count == -1:
        return devices
    if len({d.process_index for d in devices}) > 1:
        raise UserError(f"mesh.devices={count}: a run over several processes uses every device "
                        "(mesh.devices=-1)")
    if not 1 <= count <= len(devices):
        raise UserError(f"mesh.devices={count}: there are {len(devices)} devices; give 1 to "
                        f"{len(devices)}, or -1 for all")
    return devices[:count]


def make_mesh(data: int = -1, fsdp: int = 1, tensor: int = 1, devices=None) -> Mesh:
    """A (data, fsdp, tensor) mesh over `devices` (default: all of them, across every host).

    Axes are Auto (not Explicit, this JAX's make_mesh default) so that NamedSharding on jit
    arguments plus logical sharding constraints drive the partitioner, GSPMD style.
    """
    devices = list(jax.devices() if devices is None else devices)
    shape = resolve_axis_sizes((data, fsdp, tensor), len(devices))
    slices = len({getattr(d, "slice_index", 0) for d in devices})
    if slices > 1:
        return _multislice_mesh(shape, devices, slices)
    return jax.make_mesh(shape, AXES, axis_types=(AxisType.Auto,) * len(AXES), devices=devices)


def _multislice_mesh(shape: tuple[int, ...], devices: list, slices: int) -> Mesh:
    """Several TPU slices joined over the data-center network: only the data axis crosses it
    (one gradient all-reduce a step), fsdp and tensor stay on each slice's fast ICI links."""
    data, fsdp, tensor = shape
    if data % slices:
        raise UserError(f"mesh data={data} must be a multiple of the {slices} slices: only the "
                        "data axis spans slices")
    grid = mesh_utils.create_hybrid_device_mesh((data // slices, fsdp, tensor), (slices, 1, 1),
                                                devices=devices)
    return Mesh(grid, AXES, axis_types=(AxisType.Auto,) * len(AXES))
