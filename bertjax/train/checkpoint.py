"""Orbax checkpoints of a run: the train state and the data iterator's state, saved together.

    WORKDIR/checkpoints/<step>/state   parameters, optimizer state, step, RNG (sharded arrays)
    WORKDIR/checkpoints/<step>/data    the batch iterator's state (JSON)

Saves are asynchronous (the next steps run while the arrays are written); Orbax writes each step
into a temporary directory and renames it when complete, so a killed run never leaves a checkpoint
that looks whole. Restoring takes the abstract state (shapes, dtypes, shardings), so arrays come
back already sharded for the current mesh.
"""

from __future__ import annotations

import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp

from bertjax.errors import UserError

CHECKPOINT_DIR = "checkpoints"


def checkpoint_dir(workdir: str) -> str:
    return os.path.join(os.path.abspath(workdir), CHECKPOINT_DIR)


def latest_step(workdir: str) -> int | None:
    """The newest complete checkpoint's step in a workdir, without creating anything."""
    if not os.path.isdir(checkpoint_dir(workdir)):
        return None
    checkpointer = Checkpointer(workdir, read_only=True)
    try:
        return checkpointer.latest_step()
    finally:
        checkpointer.close()


class Checkpointer:
    def __init__(self, workdir: str, *, keep: int = 3, async_save: bool = True,
                 read_only: bool = False):
        options = ocp.CheckpointManagerOptions(
            max_to_keep=keep, enable_async_checkpointing=async_save, create=not read_only,
            read_only=read_only)
        self.directory = checkpoint_dir(workdir)
        # Handlers named up front, so a fresh process can read a checkpoint's metadata before
        # it has saved anything itself.
        handlers = {"state": ocp.StandardCheckpointHandler(), "data": ocp.JsonCheckpointHandler()}
        self._manager = ocp.CheckpointManager(self.directory, item_handlers=handlers,
                                              options=options)

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    def all_steps(self) -> list[int]:
        return list(self._manager.all_steps())

    def save(self, step: int, state: Any, data_state: dict) -> bool:
        """Starts an asynchronous save; returns False when the step was saved already."""
        if step in self._manager.all_steps():
            return False
        return self._manager.save(step, args=ocp.args.Composite(
            state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state)), force=True)

    def delete(self, step: int) -> None:
        """Removes a saved step (fine-tuning keeps only its best and its latest checkpoint)."""
        self._manager.delete(step)

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
        """The state at `step`, laid out as `abstract_state` says (ShapeDtypeStructs with shardings)."""
        check_compatible(self._manager.item_metadata(step)["state"], abstract_state, self.directory)
        restored = self._manager.restore(step, args=ocp.args.Composite(
            state=ocp.args.StandardRestore(abstract_state), data=ocp.args.JsonRestore()))
        return restored["state"], dict(restored["data"] or {})

    def wait(self) -> None:
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.wait_until_finished()
        self._manager.close()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def check_compatible(saved_metadata: Any, abstract_state: Any, where: str) -> None:
    """Refuses a checkpoint of another model shape or vocabulary, naming the first difference."""
    saved = _shapes(saved_metadata)
    wanted = _shapes(abstract_state)
    missing = sorted(set(wanted) - set(saved))
    extra = sorted(set(saved) - set(wanted))
    if missing or extra:
        name = (missing or extra)[0]
        verb = "lacks" if missing else "has an extra"
        raise UserError(f"the checkpoint in {where} {verb} parameter {name}: it was made with another "
                        "model or objective; use a new workdir")
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
