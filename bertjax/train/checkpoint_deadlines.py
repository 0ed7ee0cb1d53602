"""A checkpointer's storage calls on a bucket, bounded as a command bounds each of its own
(bertjax.core.storage_deadline). Orbax's requests (TensorStore's for arrays, etils' for the rest)
are not ours to bound one by one, so each checkpoint operation is bounded as a whole, with time
for the bytes it moves; an asynchronous save from its start until its write has finished."""

from __future__ import annotations

import contextlib
from typing import Any, Callable

import jax

from bertjax.core import storage, storage_deadline


class CheckpointDeadlines:
    def __init__(self, directory: str):
        self.directory = directory
        self.remote = storage.is_url(directory)
        self._save: tuple[int | None, int] | None = None  # the save in flight: its tokens

    def call(self, doing: str, nbytes: int = 0):
        """A context bounding one operation, "read checkpoint 3 from" (nothing locally)."""
        if not self.remote:
            return contextlib.nullcontext()
        return storage_deadline.bounded(self.directory, doing, nbytes)

    def saving(self, step: int, nbytes: int, in_progress: Callable[[], bool],
               restorable: int | None) -> None:
        """The background write of `step` has started: bounded until `saved()`, and said to be
        unfinished if the command is ended meanwhile."""
        self.saved()
        if not self.remote:
            return
        self._save = (
            storage_deadline.begin(self.directory, f"write checkpoint {step} to", nbytes,
                                   finished=lambda: not in_progress()),
            storage_deadline.note(unsaved(step, self.directory, restorable),
                                  pending=in_progress))

    def saved(self) -> None:
        if self._save is not None:
            token, note = self._save
            storage_deadline.end(token)
            storage_deadline.drop(note)
            self._save = None


def unsaved(step: int, directory: str, restorable: int | None) -> str:
    """What a save of `step` that did not finish leaves (on a bucket Orbax writes in place and
    marks a step complete last: an unmarked step is never listed)."""
    where = (f" (the partial objects under {storage.join(directory, str(step))} are not "
             "listed: the next save of that step replaces them)" if storage.is_url(directory)
             else "")
    if restorable is None:
        return f"checkpoint {step} was not saved, and none was before{where}"
    return (f"checkpoint {step} was not saved, checkpoint {restorable} stays restorable: run the "
            f"same command again once the storage answers{where}")


def tree_bytes(tree: Any) -> int:
    """The bytes of a state's arrays (or of their abstract shapes)."""
    return sum(int(leaf.size) * leaf.dtype.itemsize for leaf in jax.tree.leaves(tree)
               if hasattr(leaf, "dtype") and hasattr(leaf, "size"))


# What TensorStore and the HTTP clients say when the server, not the checkpoint, failed.
_STORAGE_FAULT_TEXTS = ("UNAVAILABLE", "DEADLINE_EXCEEDED", "Timeout was reached",
                        "Couldn't connect", "Connection refused", "Failed to connect",
                        "timed out", "Cannot connect to host")


def storage_fault(error: BaseException) -> str | None:
    """Why a read failed, when the storage server (not the checkpoint) is to blame: a checkpoint
    read during an outage must not be taken for a damaged one and set aside."""
    seen: BaseException | None = error
    while seen is not None:
        if isinstance(seen, (TimeoutError, ConnectionError)) or \
                type(seen).__name__ in ("FSTimeoutError", "ClientConnectorError",
                                        "ServerTimeoutError", "ServerDisconnectedError"):
            return storage_deadline.NO_ANSWER.format(storage.timeout_seconds())
        text = str(seen)
        if any(marker in text for marker in _STORAGE_FAULT_TEXTS):
            return storage_deadline.NO_ANSWER.format(storage.timeout_seconds())
        seen = seen.__cause__ or seen.__context__
    return None
