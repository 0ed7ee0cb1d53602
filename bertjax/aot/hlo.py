"""What a step does, read from the compiled program's HLO text, each op counted as many times as
it runs in a step: an op inside a while loop's body (a scanned layer stack, accumulated
micro-batches) runs once per iteration, and XLA's own cost analysis counts that body once.

- matmul FLOPs: every `dot` and `convolution` (TPU's compiler writes each dot as one), wherever
  it sits (a fusion called from a loop body counts with that body's trip count);
- HBM traffic: the operands and results of every op outside a fusion (a fusion's inside stays
  on the chip), an estimate of the bytes a step moves;
- collectives: every all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute.

A loop's trip count is read from its condition (`induction variable < constant`, the form XLA
gives the loops of `lax.scan` and `fori_loop`); a loop whose count cannot be read counts once and
is reported in `uncounted_loops`.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re

KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
          "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
          "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3b11fnuz": 1, "s4": 1, "u4": 1}
_SHAPE = re.compile(r"\b(" + "|".join(_BYTES) + r")\[([0-9,]*)\]")
_HEADER = re.compile(r"^(?:ENTRY )?%(\S+) .*\{$")
_INSTRUCTION = re.compile(r"^\s+(?:ROOT )?%(\S+) = (.*?) ([a-z][a-z0-9-]*)\(")
_CALLEES = re.compile(r"\b(body|condition|calls|to_apply|true_computation|false_computation)"
                      r"=%([^\s,)]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_CONSTANT = re.compile(r"^\s+%(\S+) = s32\[\]\S* constant\((\d+)\)")
_COMPARE = re.compile(r"compare\(%\S+, %([^\s,)]+)\), direction=LT")
_WINDOW = re.compile(r"window=\{([^}]*)\}")
_DIM_LABELS = re.compile(r"dim_labels=([0-9a-z]+)_([0-9a-z]+)->([0-9a-z]+)")
_OPERANDS = re.compile(r"%([^\s,()]+)")
# Ops that move no bytes of their own: a loop's or a call's traffic is its body's, a tuple is
# pointers, a bitcast or a get-tuple-element names an existing buffer, an async op's done half
# completes what its start half moved.
_NO_TRAFFIC = frozenset(("parameter", "constant", "tuple", "get-tuple-element", "bitcast",
                         "while", "call", "conditional", "after-all", "partition-id",
                         "replica-id", "opt-barrier", "iota"))


@dataclasses.dataclass
class Collectives:
    """Per kind: ops run a step, and the bytes of their results (one device's share)."""
    count: dict[str, int]
    bytes: dict[str, int]
    uncounted_loops: int = 0

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())


@dataclasses.dataclass
class Program:
    """A compiled step's work, one device's share, every loop iteration counted."""
    matmul_flops: int      # dots and convolutions, 2 FLOPs a multiply-add
    traffic_bytes: int     # operands + results of the ops outside fusions (an estimate)
    collectives: Collectives

    @property
    def uncounted_loops(self) -> int:
        return self.collectives.uncounted_loops


def shape_bytes(text: str) -> int:
    """Bytes of every array shape in `text` (a tuple's elements summed)."""
    return sum(_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
               for dtype, dims in _SHAPE.findall(text))


def _dims(shape: str) -> list[int]:
    """The dimensions of the first array shape in `shape`."""
    match = _SHAPE.search(shape)
    return [int(d) for d in match.group(2).split(",") if d] if match else []


def _ints(attributes: str, key: str) -> list[int]:
    match = re.search(rf"\b{key}=\{{([0-9,]*)\}}", attributes)
    return [int(d) for d in match.group(1).split(",") if d] if match else []


def _count(attributes: str, key: str) -> int:
    match = re.search(rf"\b{key}=(\d+)", attributes)
    return int(match.group(1)) if match else 1


def dot_flops(result: str, lhs: str, attributes: str) -> int:
    """2 x the result's elements x the sizes of the lhs's contracting dimensions."""
    lhs_dims = _dims(lhs)
    contracted = math.prod(lhs_dims[d] for d in _ints(attributes, "lhs_contracting_dims"))
    return 2 * math.prod(_dims(result)) * contracted


def _window(attributes: str, rank: int) -> list[dict[str, int]]:
    """A convolution's window, one dict a spatial dimension, XLA's defaults filled in."""
    dims = [{"size": 1, "stride": 1, "pad_lo": 0, "pad_hi": 0, "lhs_dilate": 1, "rhs_dilate": 1}
            for _ in range(rank)]
    window = _WINDOW.search(attributes)
    for field in window.group(1).split() if window else ():
        key, _, value = field.partition("=")
        for dim, part in zip(dims, value.split("x")):
            if key == "pad":
                low, _, high = part.partition("_")
                dim["pad_lo"], dim["pad_hi"] = int(low), int(high)
            elif key in dim:
                dim[key] = int(part)
    return dims


def _valid_positions(size_in: int, size_kernel: int, size_out: int, w: dict[str, int]) -> int:
    """(output, kernel) position pairs of one spatial dimension that read an input element, not
    padding or a dilation hole."""
    if (size_in == size_out == size_kernel == w["lhs_dilate"] and w["rhs_dilate"] == 1
            and w["stride"] == max(1, size_in - 1) and w["pad_lo"] == w["pad_hi"] == 0):
        return size_in  # a batch dimension written as a dilated window
    if (size_in == 1 and size_kernel == size_out and w["rhs_dilate"] == w["lhs_dilate"] == 1
            and w["stride"] == 1 and w["pad_lo"] == w["pad_hi"] == size_out - 1):
        return size_out  # a batch dimension written as a padded window
    valid = 0
    for k in range(size_kernel):
        for o in range(size_out):
            undilated = o * w["stride"] - w["pad_lo"] + k * w["rhs_dilate"]
            if undilated % w["lhs_dilate"] == 0 and 0 <= undilated // w["lhs_dilate"] < size_in:
                valid += 1
    return valid


def convolution_flops(result: str, lhs: str, rhs: str, attributes: str) -> int:
    """XLA's count (HloCostAnalysis::GetConvolutionFlops): 2 x input features a group x output
    features x batch a group x, per spatial dimension, the (output, kernel) position pairs that
    read an input element. TPU's compiler writes every dot as a convolution, its batch
    dimensions as windows that this counts exactly once each."""
    labels = _DIM_LABELS.search(attributes)
    if labels is None:
        return 0
    lhs_labels, rhs_labels, out_labels = labels.groups()
    lhs_dims, rhs_dims, out_dims = _dims(lhs), _dims(rhs), _dims(result)
    spatial = sorted((c for c in lhs_labels if c.isdigit()), key=int)
    positions = math.prod(
        _valid_positions(lhs_dims[lhs_labels.index(d)], rhs_dims[rhs_labels.index(d)],
                         out_dims[out_labels.index(d)], window)
        for d, window in zip(spatial, _window(attributes, len(spatial))))
    features_in = lhs_dims[lhs_labels.index("f")] // _count(attributes, "feature_group_count")
    batch = lhs_dims[lhs_labels.index("b")] // _count(attributes, "batch_group_count")
    return 2 * features_in * out_dims[out_labels.index("f")] * batch * positions


def _computations(hlo: str) -> tuple[dict[str, list[str]], str]:
    """name -> instruction lines, and the entry computation's name."""
    computations: dict[str, list[str]] = {}
    entry, current = "", None
    for line in hlo.splitlines():
        header = _HEADER.match(line)
        if header and not line.startswith(" "):
            current = header.group(1)
            computations[current] = []
            entry = current if line.startswith("ENTRY") else entry
        elif line.rstrip() == "}":  # a custom call's backend config may wrap onto "}}, ..."
            current = None
        elif current is not None:
            computations[current].append(line)
    return computations, entry


def _trip_count(condition: list[str]) -> int | None:
    constants = {m.group(1): int(m.group(2)) for m in map(_CONSTANT.match, condition) if m}
    for line in condition:
        compare = _COMPARE.search(line)
        if compare and compare.group(1) in constants:
            return constants[compare.group(1)]
    return None


def _runs(computations: dict[str, list[str]], entry: str
          ) -> tuple[dict[str, int], set[str], int]:
    """How many times each computation runs a step (entry once; a while body once per
    iteration); which run inside a fusion (their ops move no HBM bytes of their own); and how
    many loops' trip counts could not be read."""
    runs: dict[str, int] = collections.Counter()
    fused: set[str] = set()
    uncounted = 0

    def visit(name: str, times: int, inside_fusion: bool) -> None:
        nonlocal uncounted
        runs[name] += times
        if inside_fusion:
            fused.add(name)
        for line in computations.get(name, ()):
            callees = dict(_CALLEES.findall(line))
            if not callees and "branch_computations=" not in line:
                continue
            op = _INSTRUCTION.match(line)
            opcode = op.group(3) if op else ""
            trips = 1
            if "body" in callees:
                trips = _trip_count(computations.get(callees.get("condition", ""), []))
                uncounted += trips is None
                trips = trips or 1
            for role, callee in callees.items():
                # A reduction's function (to_apply) holds no dots or collectives; a call's is
                # its body.
                if role != "to_apply" or opcode == "call":
                    visit(callee, times * (trips if role in ("body", "condition") else 1),
                          inside_fusion or opcode == "fusion")
            for branches in _BRANCHES.findall(line):
                for callee in re.findall(r"%([^\s,]+)", branches):
                    visit(callee, times, inside_fusion)

    visit(entry, 1, False)
    return runs, fused, uncounted


def _traffic(opcode: str, result: str, operands: list[str], fused: str) -> int:
    """An op's HBM bytes: its operands read and its result written. In-place and partial
    accesses count what they touch: a dynamic-update-slice (or a fusion holding one) neither
    reads nor rewrites the buffer it updates (an operand shaped as a result), a dynamic slice
    (or a fusion holding one) reads no more of an operand than it writes, and an async start
    (a copy, a slice, a collective) reads no more than it writes. `fused`: the text of the
    fusion's computation, if `opcode` is a fusion."""
    if opcode in _NO_TRAFFIC or opcode.endswith("-done"):
        return 0
    sizes = [shape_bytes(o) for o in operands]
    if opcode.endswith("-start"):  # its result: the operands' buffers, the new ones, a context
        written = max(shape_bytes(result) - sum(sizes), 0)
        return written + min(sum(sizes), written)
    body = fused if opcode == "fusion" else f" {opcode}("
    parts = [f"{dtype}[{dims}]" for dtype, dims in _SHAPE.findall(result)]
    written = shape_bytes(result)
    if " dynamic-update-slice(" in body:
        for operand in operands:
            shape = _SHAPE.search(operand)
            key = f"{shape.group(1)}[{shape.group(2)}]" if shape else None
            if key in parts:  # updated in place
                parts.remove(key)
                sizes.remove(shape_bytes(operand))
                written -= shape_bytes(operand)
    if " dynamic-slice(" in body:
        sizes = [min(size, max(written, 1)) for size in sizes]
    return written + sum(sizes)


def analyse(hlo: str) -> Program:
    """A compiled module's text (`compiled.as_text()`): its matmul FLOPs, HBM traffic and
    collectives a step. An async pair (`all-gather-start` ... `all-gather-done`) counts once,
    with the done op's result."""
    computations, entry = _computations(hlo)
    runs, fused, uncounted = _runs(computations, entry)
    shapes = {}
    for lines in computations.values():
        for line in lines:
            op = _INSTRUCTION.match(line)
            if op:
                shapes[op.group(1)] = op.group(2)
    count = {kind: 0 for kind in KINDS}
    size = {kind: 0 for kind in KINDS}
    flops = traffic = 0
    for name, times in runs.items():
        for line in computations.get(name, ()):
            op = _INSTRUCTION.match(line)
            if op is None:
                continue
            result, opcode = op.group(2), op.group(3)
            arguments = line[op.end():].split(")", 1)
            operands = [shapes.get(o, "") for o in _OPERANDS.findall(arguments[0])]
            attributes = arguments[1] if len(arguments) > 1 else ""
            if opcode == "dot" and operands:
                flops += times * dot_flops(result, operands[0], attributes)
            elif opcode == "convolution" and len(operands) >= 2:
                flops += times * convolution_flops(result, operands[0], operands[1], attributes)
            if name not in fused:
                callee = dict(_CALLEES.findall(attributes)).get("calls", "")
                fused_text = "\n".join(computations.get(callee, ())) if opcode == "fusion" else ""
                traffic += times * _traffic(opcode, result, operands, fused_text)
            kind = opcode[:-len("-done")] if opcode.endswith("-done") else opcode
            if kind in KINDS:
                count[kind] += times
                size[kind] += times * shape_bytes(result)
    return Program(flops, traffic, Collectives(count, size, uncounted))


def collectives(hlo: str) -> Collectives:
    """The collectives of a compiled module's text, per step (see `analyse`)."""
    return analyse(hlo).collectives
