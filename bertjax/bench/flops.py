"""The accelerator peaks MFU is measured against, and XLA's own FLOP count of a compiled step.

Model FLOPs, the MFU basis, are bertjax/model/flops.py's analytic count. XLA's own count
(`compiled.cost_analysis()["flops"]`) is printed beside it but is not the MFU basis: it adds
elementwise work and any rematerialized forward pass, and it counts the body of a while loop
once, so a step that scans over layers (`model.scan_layers`, the default) or over micro-batches
reports roughly one layer's worth.
"""

from __future__ import annotations

# Dense (no sparsity) bf16 peak TFLOP/s of one device: vendor figures. Matched as a substring of
# JAX's `device_kind`, first match wins, so "TPU v5 lite" (v5e) precedes "TPU v5" (v5p).
PEAK_BF16_TFLOPS: tuple[tuple[str, float], ...] = (
    ("TPU v4", 275.0),
    ("TPU v5 lite", 197.0),  # v5e
    ("TPU v5e", 197.0),
    ("TPU v5p", 459.0),
    ("TPU v5", 459.0),  # v5p reports itself as "TPU v5"
    ("TPU v6 lite", 918.0),  # v6e (Trillium)
    ("H100 PCIe", 756.0),
    ("H100", 989.0),  # SXM
    ("H200", 989.0),
    ("A100", 312.0),
)


def peak_tflops(device_kind: str) -> float | None:
    """The table's bf16 peak for this device kind; None when unknown (e.g. a CPU)."""
    for name, tflops in PEAK_BF16_TFLOPS:
        if name.lower() in device_kind.lower():
            return tflops
    return None


def xla_flops(compiled) -> float | None:
    """XLA's FLOP count of a compiled step (see the module docstring for what it counts)."""
    return xla_cost(compiled, "flops")


def xla_cost(compiled, figure: str) -> float | None:
    """One figure of XLA's cost analysis ("flops", "bytes accessed"); None where the backend
    does not give it."""
    try:
        analysis = compiled.cost_analysis()
    except Exception:  # some backends do not implement it
        return None
    if isinstance(analysis, (list, tuple)):  # older JAX: one dict per computation
        analysis = analysis[0] if analysis else None
    if not analysis or figure not in analysis:
        return None
    return float(analysis[figure])
