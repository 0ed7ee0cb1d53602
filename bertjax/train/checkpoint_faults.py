"""What goes wrong with checkpoints on disk, said in one line: failed writes and unreadable steps.

Orbax reports a failed background write (a full disk, a revoked permission) from whichever later
call waits for it, as an OSError or as a TensorStore `ValueError("RESOURCE_EXHAUSTED: ...
[os_error_code='28']")`, and logs it with tracebacks on the way. These helpers turn such errors into
short reasons, keep Orbax's own error logging off stderr (every failure reaches the caller as an
exception, which is reported once), and set unreadable checkpoints aside without deleting them.
On a bucket a checkpoint is set aside without moving it (see set_aside). They also tell a state
that must not be saved at all (one with a NaN or an infinity) and a
checkpoint that is not of the model at hand (another shape or vocabulary).
"""

from __future__ import annotations

import contextlib
import datetime
import glob
import json
import logging
import os
import re
import shutil
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.core import library_logs, storage, storage_deadline
from bertjax.core.errors import UserError
from bertjax.model.gdes import WORD_DELTA

COMMIT_MARKER = "commit_success.txt"  # what Orbax writes last into a step on a bucket
UNREADABLE_SUFFIX = ".unreadable"
DIVERGED_SUFFIX = ".diverged"
_ORBAX_TMP_SUFFIX = ".orbax-checkpoint-tmp"
_TENSORSTORE_WRITE_CODES = ("RESOURCE_EXHAUSTED", "PERMISSION_DENIED", "UNAVAILABLE",
                            "DATA_LOSS", "ABORTED")
_ORBAX_DIR = os.sep + "orbax" + os.sep


class CheckpointWriteError(UserError):
    """A checkpoint could not be written (full disk, no permission); earlier ones are intact."""


def write_failure_reason(error: BaseException) -> str | None:
    """The OS-level reason when `error` (or what caused it) is a failed write, else None."""
    seen = error
    while seen is not None:
        if isinstance(seen, OSError) and seen.errno:
            return os.strerror(seen.errno)
        if isinstance(seen, TimeoutError):  # a bucket's requests are bounded (core/storage.py)
            return storage_deadline.NO_ANSWER.format(storage.timeout_seconds())
        if isinstance(seen, ConnectionError) or type(seen).__name__.startswith("ClientConnector"):
            return "the storage server cannot be reached"
        text = str(seen)
        code = re.search(r"os_error_code='?(\d+)", text)
        if code:
            return os.strerror(int(code.group(1)))
        if text.startswith(_TENSORSTORE_WRITE_CODES):
            return short_reason(seen)
        seen = seen.__cause__ or seen.__context__
    return None


def short_reason(error: BaseException, limit: int = 160) -> str:
    """An error's first line without TensorStore's spec dumps, short enough for one stderr line."""
    if str(error).startswith("Encountered error while reading array"):
        error = error.__cause__ or error.__context__ or error  # Orbax's wrapper says nothing
    if isinstance(error, OSError) and error.strerror:
        text = f"{error.strerror}: {error.filename}" if error.filename else error.strerror
    elif isinstance(error, KeyError) and error.args:
        text = str(error.args[0])
    else:
        text = str(error) or type(error).__name__
    text = text.split(" See full TensorStore details")[0].strip().splitlines()[0]
    text = re.sub(r' in OCDBT database at local file "[^"]*"', "", text)
    if isinstance(error, ValueError) and type(error) is not ValueError:
        text = f"{type(error).__name__}: {text}"  # e.g. JSONDecodeError says more than its text
    return text if len(text) <= limit else text[:limit - 3] + "..."


def describe_write_failure(step: int, directory: str, reason: str) -> str:
    free = _free_bytes(directory)
    where = f" ({_size(free)} free)" if free is not None or not storage.is_url(directory) else ""
    return f"cannot write checkpoint {step} to {directory}: {reason}{where}"


def remove_partial_save(directory: str, step: int) -> None:
    """Deletes the temporary directory a failed save of `step` left (never a finished step).
    On a bucket Orbax writes in place and marks a step complete last: an unmarked step is never
    listed, and the next save of that step replaces it."""
    if storage.is_url(directory):
        return
    for path in glob.glob(os.path.join(glob.escape(directory), f"{step}{_ORBAX_TMP_SUFFIX}*")):
        shutil.rmtree(path, ignore_errors=True)


def set_aside(directory: str, step: int, suffix: str = UNREADABLE_SUFFIX, reason: str = "") -> str:
    """Renames checkpoint `step` to `<step><suffix>[-k]`: Orbax no longer lists it, a new save of
    that step is not blocked, and whatever is in it can still be inspected or recovered. Returns
    the new name; on a bucket, the record written instead (see _set_aside_on_bucket)."""
    source = storage.join(directory, str(step))
    if storage.is_url(directory):
        return _set_aside_on_bucket(directory, step, suffix, reason)
    target = _free_name(source + suffix)
    storage.move(source, target)
    return target


def _set_aside_on_bucket(directory: str, step: int, suffix: str, reason: str) -> str:
    """A bucket has no rename: moving a step is a copy of its hundreds of objects (through
    rewrite or move requests some servers lack) and a stop midway leaves it split in two. So a
    record `<step><suffix>.json` says why, then the step's commit marker is deleted: two
    single-object requests, after which neither Orbax nor bertjax lists the step. Its objects
    stay under `<step>/` until a save of that step replaces them (Orbax clears an uncommitted
    step it saves into); the record stays as the history of what happened."""
    objects = storage.join(directory, str(step))
    record = _free_name(storage.join(directory, f"{step}{suffix}"), ".json")
    storage.write_bytes(record, json.dumps({
        "step": step, "set_aside": suffix.lstrip("."), "reason": reason,
        "when": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
        "objects": objects + "/",
        "note": f"{objects}/{COMMIT_MARKER} was deleted so that no reader lists this step; "
                "its objects stay until a save of the step replaces them"}, indent=1).encode())
    try:
        storage.remove(storage.join(objects, COMMIT_MARKER))
    except UserError:
        with contextlib.suppress(UserError):  # still listed: a record saying otherwise misleads
            storage.remove(record)
        raise
    return record


def set_aside_note(directory: str, step: int, where: str) -> str:
    """What a line about step `step`, set aside to `where` (set_aside's answer), adds: on a
    bucket, where its objects stay (locally `<step>.unreadable` says it)."""
    if not storage.is_url(directory):
        return ""
    return (f"; its objects stay under {storage.join(directory, str(step))}/ until step {step} "
            f"is saved again ({where} says why)")


def _free_name(base: str, extension: str = "") -> str:
    target, attempt = base + extension, 1
    while storage.exists(target):
        attempt += 1
        target = f"{base}-{attempt}{extension}"
    return target


def non_finite_flags(state: Any, loss: Any) -> int:
    """Bit 1: a floating-point state leaf is not finite; bit 2: the loss is not. One host fetch."""
    floats = [leaf for leaf in jax.tree.leaves(state)
              if jnp.issubdtype(leaf.dtype if hasattr(leaf, "dtype") else np.result_type(leaf),
                                jnp.inexact)]
    flags = _finiteness(floats, jnp.float32(0) if loss is None else loss)
    return int(np.asarray(flags.addressable_shards[0].data))


@jax.jit
def _finiteness(floats: list, loss: Any) -> jax.Array:
    # x * 0 is 0 where x is finite and NaN where it is not, so one sum says whether every
    # element of every leaf is finite, and no term can overflow. One check is compiled per
    # state layout, and it traces, lowers and compiles faster than an all(isfinite) per leaf.
    zeros = sum(jnp.sum(x * 0, dtype=jnp.float32) for x in floats)
    return (jnp.where(jnp.isfinite(zeros), 0, 1)
            + jnp.where(jnp.all(jnp.isfinite(loss)), 0, 2)).astype(jnp.int32)


class _DropOrbaxErrors(logging.Filter):
    """Orbax logs each failure with its traceback before re-raising it to us; the re-raised
    exception is what gets reported, so the log copy is noise on stderr."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.levelno >= logging.ERROR and _ORBAX_DIR in record.pathname)


_installed = False


def quiet_orbax_errors() -> None:
    """Installs (once) the log filter, and the hooks that drop Orbax's leftovers."""
    global _installed
    if _installed:
        return
    _installed = True
    logging.getLogger("absl").addFilter(_DropOrbaxErrors())
    library_logs.quiet_orbax_leftovers()


def _free_bytes(directory: str) -> int | None:
    if storage.is_url(directory):
        return None  # a bucket has no free space to speak of
    path = directory
    while path and not os.path.exists(path):
        path = os.path.dirname(path)
    try:
        return shutil.disk_usage(path or "/").free
    except OSError:
        return None


def _size(count: int | None) -> str:
    if count is None:
        return "unknown space"
    for unit in ("B", "KiB", "MiB", "GiB"):
        if count < 1024 or unit == "GiB":
            break
        count /= 1024
    return f"{count} B" if unit == "B" else f"{count:.1f} {unit}"


def check_compatible(saved_metadata: Any, abstract_state: Any, where: str) -> None:
    """Refuses a checkpoint of another model shape or vocabulary, naming the first difference."""
    saved = _shapes(saved_metadata)
    wanted = _shapes(abstract_state)
    missing = sorted(set(wanted) - set(saved))
    extra = sorted(set(saved) - set(wanted))
    if missing or extra:
        name = (missing or extra)[0]
        verb = "lacks" if missing else "has an extra"
        # GDES adds the delta table: a DeBERTa ELECTRA run saved before electra.embedding_sharing
        # resumes with the sharing it was trained with.
        hint = ("; or, for a run made with plain sharing, set "
                "--config.electra.embedding_sharing=plain" if WORD_DELTA in name.split("/") else "")
        raise UserError(f"the checkpoint in {where} {verb} parameter {name}: it was made with another "
                        f"model or objective; use a new workdir{hint}")
    for name, shape in wanted.items():
        if saved[name] != shape:
            raise UserError(f"the checkpoint in {where} has {name} of shape {saved[name]}, this "
                            f"config needs {shape}: it was made with another model shape or "
                            "vocabulary; use a new workdir")


def _shapes(tree: Any) -> dict[str, tuple]:
    def shape_of(leaf):
        shape = getattr(leaf, "shape", None)
        return tuple(shape) if shape is not None else np.shape(leaf)

    # Orbax stores namedtuples (optax states) as dicts or lists, so compare paths by their names
    # alone: .opt_state[1].count and ['opt_state']['1']['count'] are the same parameter.
    flat = jax.tree_util.tree_flatten_with_path(tree)[0]
    return {"/".join(_key_name(k) for k in path): shape_of(leaf) for path, leaf in flat}


def _key_name(key) -> str:
    for attr in ("name", "key", "idx"):
        if hasattr(key, attr):
            return str(getattr(key, attr))
    return str(key)
