"""Metrics out of the run: `metrics.jsonl`, TensorBoard event files and the terminal, from process 0.

The loop hands over device scalars; they are read on the host one log interval later than they were
produced (after the next step has been dispatched), so logging never stalls the accelerator.

A last line without its newline that is not a record was cut short by a killed process: a resume
drops it (its step is logged again) and says so. A damaged line anywhere else is refused in one
line naming it.
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Iterable, Mapping

from bertjax.core import atomic_files, storage
from bertjax.core.errors import UserError

METRICS_FILE = "metrics.jsonl"
TENSORBOARD_DIR = "tensorboard"


class NonFiniteLossError(RuntimeError):
    """The loss became NaN or infinite: continuing would only waste compute.

    `first_bad_checkpoint`: the lowest step whose saved parameters are suspect. A loss at step S is
    computed from the parameters after S-1 updates, so a non-finite loss at S condemns checkpoint
    S-1 even though its parameters are finite (huge, after an exploding update).
    """

    def __init__(self, message: str, first_bad_checkpoint: int | None = None):
        super().__init__(message)
        self.first_bad_checkpoint = first_bad_checkpoint


def read_metrics(workdir: str) -> list[dict]:
    """The records of `workdir`'s metrics.jsonl; UserError for a damaged line."""
    return _read_records(os.path.join(workdir, METRICS_FILE))[0]


def _read_records(path: str) -> tuple[list[dict], bool]:
    """(the records, whether the file ends in a record cut short)."""
    if not os.path.exists(path):
        return [], False
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    records = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except ValueError as e:  # UnicodeDecodeError included
            if number == len(lines):  # the last line, with no newline after it
                return records, True
            raise UserError(f"{path} line {number} is not a metrics record ({type(e).__name__}: "
                            f"{str(e)[:80]}); remove that line or move the file aside") from None
        if not isinstance(record, dict):
            raise UserError(f"{path} line {number} is not a metrics record (a JSON "
                            f"{type(record).__name__}); remove that line or move the file aside")
        records.append(record)
    return records, False


def truncate_after(workdir: str, step: int, *, shown: str | None = None) -> None:
    """Drops records logged after `step`: a resumed run logs those steps again, identically.
    A last record cut short goes too, with a line naming the file (`shown`: the workdir to name,
    a bucket's URL rather than its local mirror)."""
    path = os.path.join(workdir, METRICS_FILE)
    records, torn = _read_records(path)
    kept = [r for r in records if r.get("step", 0) <= step]
    if len(kept) == len(records) and not torn:
        return
    if torn:
        print(f"{storage.join(shown or workdir, METRICS_FILE)}: its last line was a record cut "
              f"short; dropped (the steps after {step} are logged again)", file=sys.stderr)
    atomic_files.write_text(path, "".join(json.dumps(r) + "\n" for r in kept))


def check_finite(step: int, scalars: Mapping[str, float], keys: Iterable[str] = ("loss",), *,
                 window_start: int | None = None) -> None:
    """Raises NonFiniteLossError when a value is NaN or infinite; `scalars` may summarize the steps
    `window_start`..`step`, any of which may be the one that diverged."""
    for key in keys:
        value = scalars.get(key)
        if value is not None and not math.isfinite(value):
            first = step if window_start is None else window_start
            raise NonFiniteLossError(f"{key} became {value} at step {step}", first - 1)


def _summary_writer_class():
    """tensorboardX's SummaryWriter, imported without torch. tensorboardX imports torch whenever
    it is installed (seconds of import time in every training process), only to
    recognise torch tensors, which nothing here logs; so torch is hidden while it loads unless
    the process already has it. A later `import torch` works as usual."""
    hide_torch = "torch" not in sys.modules
    if hide_torch:
        sys.modules["torch"] = None  # makes `import torch` raise ImportError
    try:
        # deferred: only process 0 writes events, and tensorboardX is slow to import
        from tensorboardX import SummaryWriter
    finally:
        if hide_torch:
            del sys.modules["torch"]
    return SummaryWriter


class MetricsWriter:
    """Appends one JSON object per logged step and mirrors scalars to TensorBoard."""

    def __init__(self, workdir: str, enabled: bool = True):
        self.enabled = enabled
        self._jsonl = None
        self._tb = None
        if not enabled:
            return
        self._jsonl = open(os.path.join(workdir, METRICS_FILE), "a", buffering=1)
        self._tb = _summary_writer_class()(os.path.join(workdir, TENSORBOARD_DIR), flush_secs=30)

    def write(self, step: int, scalars: Mapping[str, float]) -> None:
        if not self.enabled:
            return
        record = {"step": int(step)}
        record.update({k: _plain(v) for k, v in scalars.items()})
        self._jsonl.write(json.dumps(record) + "\n")
        for key, value in record.items():
            if key != "step" and isinstance(value, (int, float)):
                self._tb.add_scalar(key, value, global_step=step)

    def flush(self) -> None:
        """Everything written so far on disk (before a workdir's files are copied elsewhere)."""
        if self._jsonl is not None:
            self._jsonl.flush()
        if self._tb is not None:
            self._tb.flush()

    def close(self) -> None:
        if self._jsonl is not None:
            self._jsonl.close()
            self._jsonl = None
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def __enter__(self) -> "MetricsWriter":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _plain(value):
    if isinstance(value, (str, bool, int)):
        return value
    value = float(value)
    return value if math.isfinite(value) else str(value)
