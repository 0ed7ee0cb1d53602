"""TPU chips' published figures, and which chip a JAX device is (its `device_kind`).

The figures are per chip, dense bf16. JAX sees a v4 or v5p chip's two TensorCores as one
(megacore) device, and v5e and v6e have one TensorCore a chip: one device is one chip on each.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Chip:
    """One chip's published figures (per chip, dense bf16)."""
    family: str
    peak_bf16_tflops: float
    hbm_gib: float
    hbm_gb_per_s: float
    ici_gb_per_s: float  # all of one chip's inter-chip links together, one direction
    cores_per_chip: int  # TensorCores counted by the slice name


# Sources: Google Cloud's TPU system architecture pages, "key specifications" tables (read 2026):
#   v4  https://cloud.google.com/tpu/docs/v4   275 TFLOP/s bf16; HBM2 32 GiB, 1200 GBps
#   v5e https://cloud.google.com/tpu/docs/v5e  197 TFLOP/s; 16 GB, 819 GBps; bidirectional ICI
#                                              400 GBps a chip (4 ports)
#   v5p https://cloud.google.com/tpu/docs/v5p  459 TFLOP/s; 95 GB, 2765 GBps; bidirectional ICI
#                                              1200 GBps a chip (older revisions: "4800 Gbps")
#   v6e https://cloud.google.com/tpu/docs/v6e  918 TFLOP/s; 32 GB, 1638 GBps; bidirectional ICI
#                                              800 GBps a chip (4 ports)
# ICI here is half the bidirectional figure: one direction, the rate a ring collective moves a
# chip's data at. The v4 page gives no ICI figure: 6 ports (3D torus) at v5e's 50 GB/s a port
# one way (400 GBps / 4 ports / 2) is 300 GB/s, an estimate.
CHIPS: dict[str, Chip] = {
    "v4": Chip("v4", 275.0, 32.0, 1200.0, 300.0, 2),
    "v5e": Chip("v5e", 197.0, 16.0, 819.0, 200.0, 1),
    "v5p": Chip("v5p", 459.0, 95.0, 2765.0, 600.0, 2),
    "v6e": Chip("v6e", 918.0, 32.0, 1638.0, 400.0, 1),
}

# JAX's device_kind of each chip's devices (libtpu's names; v5p's is "TPU v5").
_DEVICE_KINDS = {"tpu v4": "v4", "tpu v5 lite": "v5e", "tpu v5e": "v5e", "tpu v5": "v5p",
                 "tpu v5p": "v5p", "tpu v6 lite": "v6e", "tpu v6e": "v6e"}


def chip_of(device_kind: str) -> Chip | None:
    """The chip a device of this kind is; None for a device without figures here (a CPU, a GPU,
    a TPU generation not in the table)."""
    family = _DEVICE_KINDS.get(device_kind.strip().lower())
    return CHIPS[family] if family else None
