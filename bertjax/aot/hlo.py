"""The collectives of a compiled program, read from its HLO text, each counted as many times as
it runs in a step: an op inside a while loop's body (a scanned layer stack, accumulated
micro-batches) runs once per iteration, and XLA's own cost analysis counts that body once.

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


@dataclasses.dataclass
class Collectives:
    """Per kind: ops run a step, and the bytes of their results (one device's share)."""
    count: dict[str, int]
    bytes: dict[str, int]
    uncounted_loops: int = 0

    @property
    def total_bytes(self) -> int:
        return sum(self.bytes.values())


def shape_bytes(text: str) -> int:
    """Bytes of every array shape in `text` (a tuple's elements summed)."""
    return sum(_BYTES[dtype] * math.prod(int(d) for d in dims.split(",") if d)
               for dtype, dims in _SHAPE.findall(text))


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
        elif line.startswith("}"):
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


def _runs(computations: dict[str, list[str]], entry: str) -> tuple[dict[str, int], int]:
    """How many times each computation runs a step (entry once; a while body once per
    iteration); and how many loops' trip counts could not be read."""
    runs: dict[str, int] = collections.Counter()
    uncounted = 0

    def visit(name: str, times: int) -> None:
        nonlocal uncounted
        runs[name] += times
        for line in computations.get(name, ()):
            callees = dict(_CALLEES.findall(line))
            trips = 1
            if "body" in callees:
                trips = _trip_count(computations.get(callees.get("condition", ""), []))
                uncounted += trips is None
                trips = trips or 1
            for role, callee in callees.items():
                if role != "to_apply":  # reduction functions hold no collectives
                    visit(callee, times * (trips if role in ("body", "condition") else 1))
            for branches in _BRANCHES.findall(line):
                for callee in re.findall(r"%([^\s,]+)", branches):
                    visit(callee, times)

    visit(entry, 1)
    return runs, uncounted


def collectives(hlo: str) -> Collectives:
    """The collectives of a compiled module's text (`compiled.as_text()`), per step. An async
    pair (`all-gather-start` ... `all-gather-done`) counts once, with the done op's result."""
    computations, entry = _computations(hlo)
    runs, uncounted = _runs(computations, entry)
    count = {kind: 0 for kind in KINDS}
    size = {kind: 0 for kind in KINDS}
    for name, times in runs.items():
        for line in computations[name]:
            op = _INSTRUCTION.match(line)
            if op is None:
                continue
            opcode = op.group(3)
            kind = opcode[:-len("-done")] if opcode.endswith("-done") else opcode
            if kind in KINDS:
                count[kind] += times
                size[kind] += times * shape_bytes(op.group(2))
    return Collectives(count, size, uncounted)
