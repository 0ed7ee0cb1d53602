"""A run's working directory: refuse what would damage it before anything is written.

`run.json` records what the checkpoints in the workdir were made with (model shape, vocabulary,
objective). Running again with a different one is refused by name instead of failing deep inside a
checkpoint restore, and nothing in the workdir is touched.
"""

from __future__ import annotations

import json
import os
import tempfile

from bertjax.errors import UserError

RUN_RECORD = "run.json"


def ensure_writable(workdir: str) -> str:
    """Creates the workdir if needed and proves it is writable; returns its absolute path."""
    path = os.path.abspath(workdir)
    if os.path.exists(path) and not os.path.isdir(path):
        raise UserError(f"workdir {workdir} exists and is not a directory")
    try:
        os.makedirs(path, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=path, prefix=".write-probe-"):
            pass
    except OSError as e:
        raise UserError(f"workdir {workdir} is not writable: {e.strerror or e}") from None
    return path


def check_run_record(workdir: str, record: dict, info: dict | None = None) -> None:
    """Compares `record` with the one stored in the workdir (if any), then stores it.

    Only the keys in `record` are compared, so settings that do not change the checkpoint layout
    (learning rate, steps) never invalidate a workdir. `info` is stored beside it uncompared (what
    later tools need to read the checkpoints: the full model config, heads, tokenizer location).
    """
    path = os.path.join(workdir, RUN_RECORD)
    stored: dict = {}
    if os.path.exists(path):
        with open(path) as f:
            stored = json.load(f)
        for key, value in record.items():
            if key in stored and stored[key] != value:
                raise UserError(f"workdir {workdir} holds a run with {key}={_short(stored[key])}, "
                                f"this config has {key}={_short(value)}; use a new workdir")
    merged = {**stored, **record, **(info or {})}
    if merged == stored:
        return
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(merged, f, indent=2, sort_keys=True)
    os.replace(tmp, path)


def _short(value) -> str:
    text = json.dumps(value, sort_keys=True)
    return text if len(text) <= 200 else text[:197] + "..."
