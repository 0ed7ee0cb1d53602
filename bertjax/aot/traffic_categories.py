"""The HLO traffic estimate split by what the bytes are for, and its largest ops, from each op's
JAX source name (the `op_name` metadata the compiler keeps) and shapes.

An op goes to the first category whose rule it meets:

    collectives            all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute
    copies_and_transposes  copy, transpose and async copy or slice ops, and fusions named for
                           them (layout changes and buffer moves the math does not need)
    optimizer_update       ops outside the model's forward and backward pass (no `jvp(` in
                           their name): the optimizer update, clipping, the gradient norm
    mlm_head               the model's ops outside the encoder: the MLM (and NSP) head, the loss
    attention              the encoder's attention outside its four projections (scores,
                           softmax, probabilities times values)
    weights                ops none of whose arrays has a token dimension (a chip's sequences or
                           tokens): weight casts and slices, gradient sums (an op with no
                           source name goes by this rule and the next)
    activations            the rest: the layers' matmuls, norms, GELU, residuals, embeddings
"""

from __future__ import annotations

import re

from bertjax.aot import hlo

CATEGORIES = ("optimizer_update", "weights", "activations", "attention", "mlm_head",
              "copies_and_transposes", "collectives")
_COPIES = ("copy", "copy-start", "transpose", "slice-start")
_PROJECTIONS = re.compile(r"/attention/(query|key|value|output)/")
_DIMS = re.compile(r"\[([0-9,]*)\]")


def category(op: hlo.OpBytes, token_dims: frozenset[int]) -> str:
    """The module docstring's category of one op; `token_dims`: a chip's sequence and token
    counts."""
    if op.opcode.removesuffix("-start").removesuffix("-done") in hlo.KINDS:
        return "collectives"
    if op.opcode in _COPIES or op.name.startswith(("copy", "transpose")):
        return "copies_and_transposes"
    if op.op_name:  # the compiler's own ops (casts it hoisted, say) carry no source name
        if "jvp(" not in op.op_name:
            return "optimizer_update"
        if "/encoder/" not in op.op_name:
            return "mlm_head"
        if "/attention/" in op.op_name and not _PROJECTIONS.search(op.op_name):
            return "attention"
    dims = {int(d) for shape in _DIMS.findall(op.shapes) for d in shape.split(",") if d}
    if not dims & token_dims:
        return "weights"
    return "activations"


def split(ops: list[hlo.OpBytes], sequences: int, tokens: int) -> dict[str, int]:
    """Bytes a step by category (every category present, zeros included)."""
    found = dict.fromkeys(CATEGORIES, 0)
    token_dims = frozenset((sequences, tokens))
    for op in ops:
        found[category(op, token_dims)] += op.bytes
    return found


def largest(ops: list[hlo.OpBytes], count: int = 10) -> list[dict]:
    """The `count` fusions that move the most bytes a step, named by the compiler and by their
    JAX source."""
    fusions = sorted((op for op in ops if op.opcode == "fusion"), key=lambda o: -o.bytes)
    return [{"name": op.name, "bytes": op.bytes, "op_name": op.op_name}
            for op in fusions[:count]]
