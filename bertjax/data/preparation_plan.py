"""The plan of a corpus preparation and the output directory's exclusive lock.

`plan.json`, written first, fingerprints the inputs (paths, sizes, times; an object URL's size and generation), the tokenizer and the
shard size: a rerun with the same fingerprint may finish the preparation; a different one is
refused before anything in the directory is touched.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import tempfile
from typing import Iterator

from bertjax.core import storage, transfer
from bertjax.data import corpus
from bertjax.data.sources import is_tfds
from bertjax.data.tokenizer import Tokenizer
from bertjax.core.errors import UserError

PLAN = "plan.json"


def tokenizer_hash(tokenizer: Tokenizer) -> str:
    """sha256 of the tokenizer's saved files: equal hashes mean equal ids for every text."""
    digest = hashlib.sha256()
    with tempfile.TemporaryDirectory() as tmp:
        tokenizer.save(tmp)
        for name in sorted(os.listdir(tmp)):
            digest.update(name.encode() + b"\0")
            with open(os.path.join(tmp, name), "rb") as f:
                digest.update(f.read())
    return digest.hexdigest()


def make_plan(files: list[str], input_format: str, tokenizer: Tokenizer, documents_per_shard: int,
          max_line_chars: int, tfds_data_dir: str | None) -> dict:
    described = []
    for path in files:
        if is_tfds(path):
            data_dir = tfds_data_dir or os.environ.get("TFDS_DATA_DIR", "")
            described.append({"tfds": path, "data_dir": data_dir and os.path.abspath(data_dir)})
        elif storage.is_url(path):  # read by a pipeline's workers, not copied here
            entry = transfer.remote_files(path)[""]
            described.append({"url": path, "size": entry["size"], "version": entry["version"]})
        else:
            st = os.stat(path)
            described.append({"path": os.path.abspath(path), "size": st.st_size,
                              "mtime_ns": st.st_mtime_ns})
    plan = {"inputs": described, "input_format": input_format,
            "tokenizer": {"kind": tokenizer.kind, "vocab_size": tokenizer.vocab_size,
                          "lowercase": tokenizer.lowercase, "sha256": tokenizer_hash(tokenizer)},
            "documents_per_shard": documents_per_shard, "max_line_chars": max_line_chars}
    plan["fingerprint"] = hashlib.sha256(json.dumps(plan, sort_keys=True).encode()).hexdigest()
    return plan


@contextlib.contextmanager
def exclusive_output(output_dir: str, plan: dict) -> Iterator[dict | None]:
    """Holds the output directory's lock; yields the manifest when this preparation is done.

    Directories that must be refused are refused before anything is created in them.
    """
    done = _existing_result(output_dir, plan)
    if done is not None:
        yield done
        return
    try:
        os.makedirs(output_dir, exist_ok=True)
        lock = open(os.path.join(output_dir, ".lock"), "a")
    except OSError as e:
        raise UserError(f"cannot write to {output_dir}: {e}") from None
    with lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise UserError(f"another preparation is writing to {output_dir}") from None
        yield _existing_result(output_dir, plan)  # again: another run may have finished it


def _existing_result(output_dir: str, plan: dict) -> dict | None:
    """The manifest when this exact preparation is done; None to (re)start; else UserError."""
    entries = sorted(n for n in os.listdir(output_dir) if n != ".lock") if os.path.isdir(
        output_dir) else []
    if not entries:
        return None
    refusal = (f"{output_dir} holds {{}} of other {{}}; nothing was changed (choose another "
               "output directory)")
    if corpus.MANIFEST in entries:
        manifest = corpus.read_manifest(output_dir)
        if manifest.get("fingerprint") == plan["fingerprint"]:
            return manifest
        raise UserError(refusal.format("a prepared corpus",
                                       _difference(manifest.get("plan"), plan)))
    if PLAN not in entries:
        shown = ", ".join(entries[:3]) + (", ..." if len(entries) > 3 else "")
        raise UserError(f"{output_dir} is not empty and holds no preparation ({shown}); "
                        "refusing to write into it")
    plan_path = os.path.join(output_dir, PLAN)
    try:
        with open(plan_path) as f:
            stored = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {plan_path}: {e}") from None
    if stored.get("fingerprint") != plan["fingerprint"]:
        raise UserError(refusal.format("an unfinished preparation", _difference(stored, plan)))
    return None


def _difference(stored: dict | None, plan: dict) -> str:
    keys = [k for k in plan if k != "fingerprint" and (stored or {}).get(k) != plan[k]]
    names = {"inputs": "inputs (paths, sizes or times)", "input_format": "input format",
             "tokenizer": "tokenizer", "documents_per_shard": "shard size",
             "max_line_chars": "max_line_chars"}
    return ", ".join(names[k] for k in keys) or "settings"
