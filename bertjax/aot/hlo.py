"""What a step does, read from the compiled program's HLO text, each op counted as many times as
it runs in a step: an op inside a while loop's body (a scanned layer stack, accumulated
micro-batches) runs once per iteration, and XLA's own cost analysis counts that body once.

- matmul FLOPs: every `dot` and `convolution` (TPU's compiler writes each dot as one), wherever
  it sits (a fusion called from a loop body counts with that body's trip count);
- HBM traffic: the operands and results in HBM of every op outside a fusion (a fusion's inside
  stays on the chip), an estimate of the bytes a step moves (`hlo_traffic`: the per-op rule), with
  each op's share kept for the report's categories and largest fusions;
- collectives: every all-reduce, all-gather, reduce-scatter, all-to-all, collective-permute.

A loop's trip count is read from its condition (`induction variable < constant`, the form XLA
gives the loops of `lax.scan` and `fori_loop`); a loop whose count cannot be read counts once and
is reported in `uncounted_loops`. A conditional (`lax.cond`, `lax.switch`) runs one branch: it
counts the branch with the most HBM traffic (then the most FLOPs), not the sum of all.
"""

from __future__ import annotations

import collections
import dataclasses
import math
import re

from bertjax.aot import hlo_traffic

KERNEL_CALL = 'custom_call_target="tpu_custom_call"'  # a Pallas (Mosaic) kernel in TPU HLO
KINDS = ("all-reduce", "all-gather", "reduce-scatter", "all-to-all", "collective-permute")

_HEADER = re.compile(r"^(?:ENTRY )?%(\S+) .*\{$")
_CALLEES = re.compile(r"\b(body|condition|calls|to_apply|true_computation|false_computation)"
                      r"=%([^\s,)]+)")
_BRANCHES = re.compile(r"branch_computations=\{([^}]*)\}")
_CONSTANT = re.compile(r"^\s+%(\S+) = s32\[\]\S* constant\((\d+)\)")
_COMPARE = re.compile(r"compare\(%\S+, %([^\s,)]+)\), direction=LT")
_WINDOW = re.compile(r"window=\{([^}]*)\}")
_DIM_LABELS = re.compile(r"dim_labels=([0-9a-z]+)_([0-9a-z]+)->([0-9a-z]+)")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
shape_bytes = hlo_traffic.shape_bytes


@dataclasses.dataclass(frozen=True)
class OpBytes:
    """One op outside a fusion: its HBM bytes and matmul FLOPs a step (every run counted)."""
    name: str
    opcode: str
    op_name: str   # the JAX source's name from the op's metadata ("" if none)
    shapes: str    # its result's and operands' shapes, for the report's categories
    bytes: int
    flops: int = 0  # its own dots and convolutions, or those of the fusion it runs


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
    ops: list[OpBytes] = dataclasses.field(default_factory=list)  # traffic_bytes by op
    kernel_calls: int = 0  # Pallas (Mosaic) kernels called, whose matmuls the HLO does not show

    @property
    def uncounted_loops(self) -> int:
        return self.collectives.uncounted_loops


def _dims(shape: str) -> list[int]:
    """The dimensions of the first array shape in `shape`."""
    match = hlo_traffic.ARRAY.search(shape)
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


_KNOWN_TRIPS = re.compile(r'"known_trip_count":\{"n":"(\d+)"\}')


def _trip_count(condition: list[str]) -> int | None:
    constants = {m.group(1): int(m.group(2)) for m in map(_CONSTANT.match, condition) if m}
    for line in condition:
        compare = _COMPARE.search(line)
        if compare and compare.group(1) in constants:
            return constants[compare.group(1)]
    return None


@dataclasses.dataclass
class _Tally:
    """One run of a computation: what it and everything it calls do."""
    flops: int = 0
    traffic: int = 0
    count: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    size: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    ops: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    op_flops: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    uncounted: int = 0

    def add(self, other: "_Tally", times: int) -> None:
        self.flops += times * other.flops
        self.traffic += times * other.traffic
        self.uncounted += other.uncounted
        for mine, theirs in ((self.count, other.count), (self.size, other.size),
                             (self.ops, other.ops), (self.op_flops, other.op_flops)):
            for key, value in theirs.items():
                mine[key] += times * value


class _Reader:
    """Tallies computations bottom-up, each (computation, inside a fusion) once."""

    def __init__(self, hlo: str):
        self.computations, self.entry = _computations(hlo)
        self.fusions = hlo_traffic.Fusions(self.computations)
        self.shapes = {}
        for lines in self.computations.values():
            for line in lines:
                op = hlo_traffic.parse([line])[0]
                self.shapes.update((name, i.shape) for name, i in op.items())
        self.done: dict[tuple[str, bool], _Tally] = {}

    def tally(self, name: str, fused: bool) -> _Tally:
        if (name, fused) not in self.done:
            self.done[name, fused] = _Tally()  # a cycle (none in valid HLO) counts nothing
            self.done[name, fused] = self._tally(name, fused)
        return self.done[name, fused]

    def _tally(self, name: str, fused: bool) -> _Tally:
        total = _Tally()
        instructions = hlo_traffic.parse(self.computations.get(name, []))[0]
        for op_name, op in instructions.items():
            key = self._own(total, op_name, op, fused)
            callees = dict(_CALLEES.findall(op.attributes))
            trips = 1
            if "body" in callees:
                found = _trip_count(self.computations.get(callees.get("condition", ""), []))
                if found is None:  # GPU fuses the compare; the loop's backend_config says
                    known = _KNOWN_TRIPS.search(op.attributes)
                    found = int(known.group(1)) if known else None
                total.uncounted += found is None
                trips = found or 1
            branches = [self.tally(callee, fused)
                        for group in _BRANCHES.findall(op.attributes)
                        for callee in re.findall(r"%([^\s,]+)", group)]
            for role, callee in callees.items():
                if role in ("true_computation", "false_computation"):
                    branches.append(self.tally(callee, fused))
                # A reduction's function (to_apply) holds no dots or collectives; a call's is
                # its body.
                elif role != "to_apply" or op.opcode == "call":
                    called = self.tally(callee, fused or op.opcode == "fusion")
                    total.add(called, trips)
                    if key and op.opcode == "fusion":  # the fusion's matmuls are this op's
                        total.op_flops[key] += called.flops
            if branches:  # one branch runs: the largest
                total.add(max(branches, key=lambda t: (t.traffic, t.flops)), 1)
        return total

    def _own(self, total: _Tally, name: str, op: hlo_traffic.Instruction,
             fused: bool) -> tuple | None:
        """Counts `op`'s own work; returns its key in the op table (None inside a fusion)."""
        operands = [self.shapes.get(o, "") for o in op.operands]
        flops = 0
        if op.opcode == "dot" and operands:
            flops = dot_flops(op.shape, operands[0], op.attributes)
        elif op.opcode == "convolution" and len(operands) >= 2:
            flops = convolution_flops(op.shape, operands[0], operands[1], op.attributes)
        total.flops += flops
        kind = op.opcode.removesuffix("-done")
        if kind in KINDS:
            total.count[kind] += 1
            total.size[kind] += shape_bytes(op.shape)
        if fused:
            return None
        moved = hlo_traffic.op_traffic(op.opcode, op.shape, operands, op.attributes,
                                       self.fusions)
        total.traffic += moved
        source = _OP_NAME.search(op.attributes)
        key = (name, op.opcode, source.group(1) if source else "",
               " ".join([op.shape, *operands]))
        if moved:
            total.ops[key] += moved
        if flops:
            total.op_flops[key] += flops
        return key


def analyse(hlo: str) -> Program:
    """A compiled module's text (`compiled.as_text()`): its matmul FLOPs, HBM traffic and
    collectives a step. An async pair (`all-gather-start` ... `all-gather-done`) counts once,
    with the done op's result."""
    reader = _Reader(hlo)
    total = reader.tally(reader.entry, False)
    ops = [OpBytes(*key, total.ops[key], total.op_flops[key])
           for key in total.ops.keys() | total.op_flops.keys()]
    return Program(total.flops, total.traffic,
                   Collectives({kind: total.count[kind] for kind in KINDS},
                               {kind: total.size[kind] for kind in KINDS}, total.uncounted),
                   sorted(ops, key=lambda o: -o.bytes), hlo.count(KERNEL_CALL))

def collectives(hlo: str) -> Collectives:
    """The collectives of a compiled module's text, per step (see `analyse`)."""
    return analyse(hlo).collectives
