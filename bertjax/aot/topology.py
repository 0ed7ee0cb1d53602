"""TPU slices as users name them (v4-32, v5e-8, v5litepod-256, ...), their chips' published
figures, and libtpu's compile-only devices for them; likewise one node of NVIDIA GPUs (h100-8,
h200-8), whose compile-only devices the CUDA plugin (the gpu-compile extra) gives.

The number in a slice's name counts TensorCores for v4 and v5p (two a chip, which JAX sees as
one megacore device) and chips for v5e and v6e (one TensorCore a chip). libtpu names a topology
by its chip grid: v4-8 is "v4:2x2x1" (4 chips), v5e-8 "v5e:2x4" (8 chips).
"""

from __future__ import annotations

import dataclasses
import os
import re

import jax
from jax.experimental import topologies

from bertjax.aot import gpu
from bertjax.core import extras
from bertjax.core.errors import UserError
from bertjax.parallel.chips import CHIPS, GPUS, Chip


_GPUS_A_NODE = (1, 2, 4, 8)

# Chips in a slice -> libtpu's chip grid. v4 and v5p slices are 3D tori, v5e and v6e 2D.
_GRIDS_3D = {4: "2x2x1", 8: "2x2x2", 16: "2x2x4", 32: "2x4x4", 64: "4x4x4", 128: "4x4x8",
             256: "4x8x8", 512: "8x8x8", 1024: "8x8x16", 2048: "8x16x16"}
_GRIDS_2D = {1: "1x1", 4: "2x2", 8: "2x4", 16: "4x4", 32: "4x8", 64: "8x8", 128: "8x16",
             256: "16x16"}
_ALIASES = {"v5litepod": "v5e", "v5lite": "v5e", "v6": "v6e"}


@dataclasses.dataclass(frozen=True)
class Slice:
    name: str            # as the user wrote it, normalised (v5e-8)
    chip: Chip
    chips: int
    libtpu_name: str     # v5e:2x4
    accelerator_type: str  # what TPU_ACCELERATOR_TYPE says on such a VM (v5litepod-8)


def known_names() -> list[str]:
    names = []
    for family, chip in CHIPS.items():
        grids = _GRIDS_3D if family in ("v4", "v5p") else _GRIDS_2D
        names += [f"{family}-{chips * chip.cores_per_chip}" for chips in grids]
    return names + [f"{family}-{count}" for family in GPUS for count in _GPUS_A_NODE]


def parse(name: str) -> Slice:
    """The slice a user's name means; an unknown name is refused listing the known ones."""
    gpu = re.fullmatch(r"(h100|h200)-(\d+)", name.strip().lower())
    if gpu and int(gpu.group(2)) in _GPUS_A_NODE:  # one node; the plugin's grid: 1 x 1 x count
        count = int(gpu.group(2))
        return Slice(f"{gpu.group(1)}-{count}", GPUS[gpu.group(1)], count, f"cuda:1x1x{count}",
                     gpu.group(1))
    match = re.fullmatch(r"(v4|v5e|v5p|v6e|v5litepod|v5lite|v6)-(\d+)", name.strip().lower())
    family = _ALIASES.get(match.group(1), match.group(1)) if match else None
    chip = CHIPS.get(family) if family else None
    count = int(match.group(2)) if match else 0
    grids = _GRIDS_3D if family in ("v4", "v5p") else _GRIDS_2D
    chips = count // chip.cores_per_chip if chip else 0
    if chip is None or count % chip.cores_per_chip or chips not in grids:
        raise UserError(f"unknown topology {name!r}; known: {', '.join(known_names())} "
                        "(v5litepod-N is v5e-N)")
    normalised = f"{family}-{count}"
    accelerator = f"v5litepod-{count}" if family == "v5e" else normalised
    return Slice(normalised, chip, chips, f"{family}:{grids[chips]}", accelerator)


def _environment(accelerator_type: str) -> None:
    """What libtpu reads at load to describe the machine it runs on. Set before it loads; without
    them libtpu queries a metadata server this CPU machine does not have, and warns. JAX itself
    stays on the CPU: nothing runs on the described TPU, it is only compiled for."""
    if not jax.config.jax_platforms:  # the user's choice stands (e.g. JAX_PLATFORMS=cpu)
        jax.config.update("jax_platforms", "cpu")
    os.environ.setdefault("TPU_ACCELERATOR_TYPE", accelerator_type)
    os.environ.setdefault("TPU_WORKER_HOSTNAMES", "localhost")
    os.environ.setdefault("TPU_WORKER_ID", "0")
    os.environ.setdefault("TPU_SKIP_MDS_QUERY", "1")
    # libtpu locks /tmp/libtpu_lockfile so two processes do not drive one TPU; compiling drives
    # none, and two compiles (or a compile beside a test run) must not refuse each other.
    os.environ.setdefault("ALLOW_MULTIPLE_LIBTPU_LOAD", "1")


def devices(slice_: Slice, num_slices: int = 1) -> list:
    """libtpu's compile-only devices of `num_slices` such slices (JAX devices one can compile
    for, not run on), in the order the topology lists them."""
    if slice_.chip.platform == "cuda":
        return gpu.devices(slice_.name, slice_.chip.family, slice_.chips, num_slices)
    # libtpu (the tpu extra) is what JAX compiles with; importing it only sets TPU_LIBRARY_PATH
    extras.require("libtpu", "tpu", "compiling for a TPU slice")
    if num_slices < 1:
        raise UserError(f"--num-slices must be at least 1, got {num_slices}")
    _environment(slice_.accelerator_type)
    options = {"chip_config_name": "megacore"} if slice_.chip.cores_per_chip == 2 else {}
    if num_slices > 1:
        options["num_slices"] = num_slices
    description = topologies.get_topology_desc(platform="tpu",
                                               topology_name=slice_.libtpu_name, **options)
    found = list(description.devices)
    if len(found) != slice_.chips * num_slices:
        raise UserError(f"libtpu describes {len(found)} devices for {slice_.name} x "
                        f"{num_slices}, expected {slice_.chips * num_slices} chips")
    return found
