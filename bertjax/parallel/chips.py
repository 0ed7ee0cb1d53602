"""TPU chips' and NVIDIA GPUs' published figures, and which chip a JAX device is (its
`device_kind`).

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
    platform: str = "tpu"  # the JAX platform that compiles for it: tpu, or cuda for a GPU


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

# Sources: NVIDIA's data sheets (read 2026), SXM form factor; the Tensor Core figures there are
# "with sparsity", twice the dense rate used here.
#   H100 https://www.nvidia.com/en-us/data-center/h100/  BF16 1,979 TFLOPS (sparse); 80 GB HBM3,
#                                                        3.35 TB/s; NVLink 900 GB/s
#   H200 https://www.nvidia.com/en-us/data-center/h200/  BF16 1,979 TFLOPS (sparse); 141 GB
#                                                        HBM3e, 4.8 TB/s; NVLink 900 GB/s
# NVLink's 900 GB/s is both directions together; the "ICI" figure here is one direction (450).
# HBM is the bytes the device reports (XLA's gpu specs: 84942979072 and 151397597184).
GPUS: dict[str, Chip] = {
    "h100": Chip("h100", 989.5, 84942979072 / 2**30, 3350.0, 450.0, 1, "cuda"),
    "h200": Chip("h200", 989.5, 151397597184 / 2**30, 4800.0, 450.0, 1, "cuda"),
}

# JAX's device_kind of each chip's devices (libtpu's names; v5p's is "TPU v5"; CUDA's names).
_DEVICE_KINDS = {"tpu v4": "v4", "tpu v5 lite": "v5e", "tpu v5e": "v5e", "tpu v5": "v5p",
                 "tpu v5p": "v5p", "tpu v6 lite": "v6e", "tpu v6e": "v6e",
                 "nvidia h100 80gb hbm3": "h100", "nvidia h200": "h200",
                 "nvidia h200 141gb hbm3e": "h200"}


def chip_of(device_kind: str) -> Chip | None:
    """The chip a device of this kind is; None for a device without figures here (a CPU, another
    GPU, a TPU generation not in the table)."""
    family = _DEVICE_KINDS.get(device_kind.strip().lower())
    return {**CHIPS, **GPUS}[family] if family else None
