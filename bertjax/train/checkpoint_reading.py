"""Reading one checkpoint step, told apart by what went wrong: damage (Unreadable: the caller
sets the step aside and tries an older one), another model (UserError: nothing moves), or a
storage server that stopped answering (UserError: nothing moves, the same command runs again)."""

from __future__ import annotations

from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from bertjax.core import storage
from bertjax.core.errors import UserError
from bertjax.train import checkpoint_faults as faults
from bertjax.train.checkpoint_deadlines import CheckpointDeadlines, storage_fault, tree_bytes


class Unreadable(Exception):
    """A checkpoint that is damaged on disk (as opposed to one of another model)."""


def state_metadata(manager: ocp.CheckpointManager, deadlines: CheckpointDeadlines,
                   step: int) -> Any:
    """The saved state's tree of array metadata; Unreadable when it does not read."""
    try:
        with deadlines.call(f"read checkpoint {step} from"):
            saved = manager.item_metadata(step)["state"]
    except KeyError:
        raise Unreadable("its state item is missing") from None
    except Exception as e:
        refuse_storage_fault(deadlines, step, e)
        raise Unreadable(f"metadata: {faults.short_reason(e)}") from None
    if saved is None:
        raise Unreadable("metadata: state/_METADATA is missing")
    return saved


def restore_checked(manager: ocp.CheckpointManager, deadlines: CheckpointDeadlines, step: int,
                    abstract_state: Any) -> tuple[Any, dict]:
    """Restores `step`; raises Unreadable for damage and UserError for another model."""
    faults.check_compatible(state_metadata(manager, deadlines, step), abstract_state,
                            deadlines.directory)
    try:
        with deadlines.call(f"read checkpoint {step} from", tree_bytes(abstract_state)):
            restored = manager.restore(step, args=ocp.args.Composite(
                state=ocp.args.StandardRestore(abstract_state),
                data=ocp.args.JsonRestore()))
    except (UserError, MemoryError):
        raise
    except Exception as e:
        if "RESOURCE_EXHAUSTED: Out of memory" in str(e):  # the device's fault, not the file's
            raise
        refuse_storage_fault(deadlines, step, e)
        raise Unreadable(faults.short_reason(e)) from None
    return restored["state"], dict(restored["data"] or {})


def refuse_storage_fault(deadlines: CheckpointDeadlines, step: int, error: Exception) -> None:
    """UserError when `error` is the storage server's fault rather than the checkpoint's."""
    reason = storage_fault(error) if deadlines.remote else None
    if reason:
        storage.mark_unanswering(deadlines.directory)
        raise UserError(f"cannot read checkpoint {step} from {deadlines.directory}: {reason}; "
                        "nothing was set aside: run the same command again once the "
                        "storage answers") from None


def agreed_failure(reason: str | None) -> str | None:
    """Every process must fall back together: one failed read makes the step unreadable for all."""
    if jax.process_count() == 1:
        return reason
    failed = multihost_utils.process_allgather(np.int32(reason is not None))
    if reason is None and np.any(failed):
        return "unreadable on another process"
    return reason
