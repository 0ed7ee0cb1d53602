"""The HBM bytes one op of a compiled TPU program reads and writes: the per-op rule of the traffic
estimate (`hlo.analyse` sums it over the program).

Only bytes in HBM count. TPU's compiler writes each array's memory space in its layout: `S(1)`
(VMEM), `S(2)`, `S(6)` and the like are on-chip memories, so an operand or result placed there
moves no HBM bytes; an array with no `S(n)` (space 0) is in HBM.

A fusion reads each operand in HBM once, whole, unless the fusion only slices it: an operand
used inside the fusion (through bitcasts and nested fusions) only as the sliced operand of
`slice` / `dynamic-slice` is read for the slices' bytes, and one used only as the buffer a
`dynamic-update-slice` updates in place is not read at all; that in-place result writes only the
update. Views and allocations move nothing: parameters, constants, tuples, bitcasts, an async
op's done half, and the custom calls TPU's compiler uses to name a buffer (`AllocateBuffer`,
`ConcatBitcast`: slices written side by side, viewed as one array).
"""

from __future__ import annotations

import dataclasses
import math
import re

_BYTES = {"pred": 1, "s8": 1, "u8": 1, "s16": 2, "u16": 2, "f16": 2, "bf16": 2, "s32": 4,
          "u32": 4, "f32": 4, "s64": 8, "u64": 8, "f64": 8, "c64": 8, "c128": 16,
          "f8e4m3fn": 1, "f8e5m2": 1, "f8e4m3b11fnuz": 1, "s4": 1, "u4": 1}
# An array shape and, if written, its layout ({minor-to-major:tiling S(memory space)}).
ARRAY = re.compile(r"\b(" + "|".join(_BYTES) + r")\[([0-9,]*)\](\{[^}]*\})?")
_SPACE = re.compile(r"S\((\d+)\)")
_INSTRUCTION = re.compile(r"^\s+(?:ROOT )?%(\S+) = (.*?) ([a-z][a-z0-9-]*)\(")
_OPERANDS = re.compile(r"%([^\s,()]+)")
_PARAMETER = re.compile(r"parameter\((\d+)\)")
_TARGET = re.compile(r'custom_call_target="([^"]+)"')
# Ops that move no bytes of their own: a loop's or a call's traffic is its body's, a tuple is
# pointers, a bitcast or a get-tuple-element names an existing buffer.
NO_TRAFFIC = frozenset(("parameter", "constant", "tuple", "get-tuple-element", "bitcast",
                        "while", "call", "conditional", "after-all", "partition-id",
                        "replica-id", "opt-barrier", "iota"))
VIEW_CUSTOM_CALLS = frozenset(("AllocateBuffer", "ConcatBitcast", "AssumeGatherIndicesInBound"))
_SLICES = ("slice", "dynamic-slice")


def array_bytes(dtype: str, dims: str) -> int:
    return _BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)


def shape_bytes(text: str) -> int:
    """Bytes of every array shape in `text` (a tuple's elements summed), wherever they live."""
    return sum(array_bytes(dtype, dims) for dtype, dims, _ in ARRAY.findall(text))


def hbm_bytes(text: str) -> int:
    """Bytes of the array shapes in `text` that live in HBM (memory space 0)."""
    return sum(array_bytes(dtype, dims) for dtype, dims, layout in ARRAY.findall(text)
               if not any(int(s) for s in _SPACE.findall(layout)))


@dataclasses.dataclass
class Instruction:
    shape: str
    opcode: str
    operands: list[str]
    attributes: str


def parse(lines: list[str]) -> tuple[dict[str, Instruction], dict[int, str], str]:
    """A computation's instructions by name, its parameters by index, and its root's name."""
    found, parameters, root = {}, {}, ""
    for line in lines:
        op = _INSTRUCTION.match(line)
        if op is None:
            continue
        arguments = line[op.end():].split(")", 1)
        found[op.group(1)] = Instruction(op.group(2), op.group(3),
                                         _OPERANDS.findall(arguments[0]),
                                         arguments[1] if len(arguments) > 1 else "")
        if op.group(3) == "parameter":
            parameters[int(_PARAMETER.search(line).group(1))] = op.group(1)
        if line.lstrip().startswith("ROOT "):
            root = op.group(1)
    return found, parameters, root


class Fusions:
    """What a fusion reads of each operand, from its computation (parsed once each)."""

    def __init__(self, computations: dict[str, list[str]]):
        self.computations = computations
        self.parsed: dict[str, tuple] = {}

    def _parsed(self, name: str):
        if name not in self.parsed:
            self.parsed[name] = parse(self.computations.get(name, []))
        return self.parsed[name]

    def read(self, computation: str, index: int) -> int | None:
        """Bytes the fusion reads of its operand `index` if it only slices it or updates it in
        place (0); None if it reads it whole."""
        instructions, parameters, _ = self._parsed(computation)
        return self._read_value(instructions, parameters.get(index, ""))

    def _read_value(self, instructions: dict[str, Instruction], name: str) -> int | None:
        total = 0
        for user_name, user in instructions.items():
            if name not in user.operands:
                continue
            position = user.operands.index(name)
            if user.opcode in _SLICES and position == 0:
                total += shape_bytes(user.shape)
            elif user.opcode == "dynamic-update-slice" and position == 0:
                continue  # the buffer updated in place: not read
            elif user.opcode == "bitcast":
                part = self._read_value(instructions, user_name)
                if part is None:
                    return None
                total += part
            elif user.opcode == "fusion":
                callee = re.search(r"calls=%([^\s,)]+)", user.attributes)
                part = self.read(callee.group(1), position) if callee else None
                if part is None:
                    return None
                total += part
            else:
                return None
        return total

    def written(self, computation: str, result: str) -> int:
        """HBM bytes the fusion writes: its result's, an in-place update's part only its
        update's."""
        instructions, parameters, root = self._parsed(computation)
        top = instructions.get(root)
        if top is None:
            return hbm_bytes(result)
        parts = top.operands if top.opcode == "tuple" else [root]
        arrays = ARRAY.findall(result)
        if len(arrays) != len(parts):
            return hbm_bytes(result)
        total = 0
        for (dtype, dims, layout), part in zip(arrays, parts):
            if any(int(s) for s in _SPACE.findall(layout)):
                continue
            update = self._in_place_update(instructions, set(parameters.values()), part)
            total += array_bytes(dtype, dims) if update is None else update
        return total

    def _in_place_update(self, instructions, parameters: set[str], name: str) -> int | None:
        """The update's bytes if `name` is a dynamic-update-slice of a fusion parameter."""
        op = instructions.get(name)
        while op is not None and op.opcode == "bitcast":
            op = instructions.get(op.operands[0])
        if op is None or op.opcode != "dynamic-update-slice":
            return None
        buffer = op.operands[0]
        while buffer in instructions and instructions[buffer].opcode == "bitcast":
            buffer = instructions[buffer].operands[0]
        if buffer not in parameters:
            return None
        return shape_bytes(instructions[op.operands[1]].shape)


def op_traffic(opcode: str, result: str, operands: list[str], attributes: str,
               fusions: Fusions) -> int:
    """An op's HBM bytes: its operands read and its result written (see the module docstring).
    An async start (a copy, a slice, a collective) reads no more than it writes; its result
    holds its operands' buffers, the new ones, and a context."""
    if opcode in NO_TRAFFIC or opcode.endswith("-done"):
        return 0
    if opcode == "custom-call":
        target = _TARGET.search(attributes)
        if target and target.group(1) in VIEW_CUSTOM_CALLS:
            return 0
    sizes = [hbm_bytes(o) for o in operands]
    if opcode.endswith("-start"):
        written = max(shape_bytes(result) - sum(shape_bytes(o) for o in operands), 0)
        written_hbm = max(hbm_bytes(result) - sum(sizes), 0)
        return written_hbm + min(sum(sizes), written)
    if opcode == "fusion":
        callee = re.search(r"calls=%([^\s,)]+)", attributes)
        if callee:
            reads = [fusions.read(callee.group(1), i) for i in range(len(operands))]
            sizes = [size if read is None else min(size, read)
                     for size, read in zip(sizes, reads)]
            return fusions.written(callee.group(1), result) + sum(sizes)
    if opcode == "dynamic-update-slice" and len(operands) >= 2:
        return 2 * sizes[1] + sum(sizes[2:])  # the buffer updated in place
    if opcode in _SLICES and operands:
        return hbm_bytes(result) + min(sizes[0], shape_bytes(result)) + sum(sizes[1:])
    return hbm_bytes(result) + sum(sizes)
