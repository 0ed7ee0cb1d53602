"""Orbax checkpoints of a run: the train state and the data iterator's state, saved together.

    WORKDIR/checkpoints/<step>/state   parameters, optimizer state, step, RNG (sharded arrays)
    WORKDIR/checkpoints/<step>/data    the batch iterator's state (JSON)

Saves are asynchronous (the next steps run while the arrays are written); Orbax writes each step
into a temporary directory and renames it when complete, so a killed run never leaves a checkpoint
that looks whole. Restoring takes the abstract state (shapes, dtypes, shardings), so arrays come
back already sharded for the current mesh.

Nothing good is ever lost: a state with a NaN or an infinity is never saved; retention counts only
checkpoints whose parameters have since produced a finite loss (so finite-but-exploded parameters
saved just before a divergence cannot push the last good checkpoint out), and a divergence sets the
checkpoints it condemns aside as `<step>.diverged`; a checkpoint that no longer reads is renamed
`<step>.unreadable` and the previous one is used (on a bucket a step is set aside in place, by
a record and the deletion of its commit marker: checkpoint_faults.set_aside); a failed write (full disk) is one line that names
the free space while the earlier checkpoints stay as they were.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import jax
import orbax.checkpoint as ocp
from jax.experimental import multihost_utils

from bertjax.core import storage
from bertjax.core.errors import UserError
from bertjax.train import checkpoint_faults as faults
from bertjax.train import checkpoint_reading as reading
from bertjax.train.checkpoint_deadlines import CheckpointDeadlines, tree_bytes, unsaved
from bertjax.train.checkpoint_faults import CheckpointWriteError  # noqa: F401 (re-exported)
from bertjax.train.metrics_log import NonFiniteLossError
from bertjax.train.orbax_arrays import split_only_large_arrays

CHECKPOINT_DIR = "checkpoints"


def checkpoint_dir(workdir: str) -> str:
    return storage.join(storage.absolute(workdir), CHECKPOINT_DIR)


def latest_step(workdir: str) -> int | None:
    """The newest complete checkpoint's step in a workdir, without creating anything."""
    if not storage.isdir(checkpoint_dir(workdir)):
        return None
    try:
        checkpointer = Checkpointer(workdir, read_only=True)
        try:
            return checkpointer.latest_step()
        finally:
            checkpointer.close()
    except UserError:
        raise
    except Exception as e:  # a damaged directory is reported, not a traceback
        raise UserError(f"cannot list the checkpoints in {checkpoint_dir(workdir)}: "
                        f"{faults.short_reason(e)}") from None


class Checkpointer:
    def __init__(self, workdir: str, *, keep: int | None = 3, async_save: bool = True,
                 read_only: bool = False):
        if keep is not None and keep < 0:
            raise UserError(f"keep={keep}: the number of checkpoints to keep cannot be negative "
                            "(0 keeps them all)")
        faults.quiet_orbax_errors()
        split_only_large_arrays()
        self.directory = checkpoint_dir(workdir)
        self._deadlines = CheckpointDeadlines(self.directory)
        self.read_only = read_only
        self._keep = keep or None  # 0 and None keep them all
        # Steps below this have produced a finite loss from their parameters (see save()).
        self._proven_below = 0
        # Retention is ours, not Orbax's max_to_keep: Orbax would count unproven checkpoints too.
        options = ocp.CheckpointManagerOptions(
            max_to_keep=None, enable_async_checkpointing=async_save,
            create=not read_only, read_only=read_only)
        # Handlers named up front, so a fresh process can read a checkpoint's metadata before
        # it has saved anything itself.
        # On a bucket, plain zarr chunks: OCDBT's manifest needs preconditions not every store has.
        ocdbt = not storage.is_url(self.directory)
        handlers = {"state": ocp.StandardCheckpointHandler(use_ocdbt=ocdbt),
                    "data": ocp.JsonCheckpointHandler()}
        self._saving_step: int | None = None  # the step whose write may still be in flight
        self._restorable: int | None = None  # the newest saved step when that write started
        self._failure: CheckpointWriteError | None = None
        self._skipped: set[int] = set()  # unreadable steps a read-only checkpointer passes over
        try:
            with self._deadlines.call("open the checkpoints in"):
                self._manager = ocp.CheckpointManager(self.directory, item_handlers=handlers,
                                                      options=options)
        except OSError as e:
            raise UserError(f"cannot open the checkpoints in {self.directory}: "
                            f"{faults.short_reason(e)}") from None

    def latest_step(self) -> int | None:
        steps = self.all_steps()
        return max(steps) if steps else None

    def all_steps(self) -> list[int]:
        with self._deadlines.call("list the checkpoints in"):
            steps = self._manager.all_steps()
        return [s for s in steps if s not in self._skipped]

    def save(self, step: int, state: Any, data_state: dict, *, metrics: dict | None = None
             ) -> bool:
        """Starts an asynchronous save; returns False when the step was saved already.

        Raises NonFiniteLossError, writing nothing, when a floating-point leaf of `state` or
        `metrics["loss"]` is NaN or infinite; CheckpointWriteError when this or the previous
        save cannot be written.

        `metrics["loss"]` (the loss of `step`, computed from the parameters after step-1 updates)
        proves every earlier checkpoint good; only proven checkpoints count towards `keep`, so at
        most keep+1 are on disk and the newest proven one is never deleted.
        """
        if self._failure is not None:
            raise self._failure
        loss = (metrics or {}).get("loss")
        self._refuse_non_finite(step, state, loss)
        self.wait()  # a failure of the previous save surfaces here
        if loss is not None:
            self._proven_below = max(self._proven_below, step)
        if step in self.all_steps():
            return False
        self._saving_step = step
        restorable, nbytes = self.latest_step(), tree_bytes(state)
        self._restorable = restorable
        with self._write_errors(), self._deadlines.call(f"write checkpoint {step} to", nbytes):
            started = self._manager.save(step, args=ocp.args.Composite(
                state=ocp.args.StandardSave(state), data=ocp.args.JsonSave(data_state)),
                force=True)
        self._deadlines.saving(step, nbytes, self._manager.is_saving_in_progress, restorable)
        self._apply_retention()
        return started

    def _apply_retention(self) -> None:
        if self._keep is None:
            return
        proven = sorted(s for s in self.all_steps() if s < self._proven_below)
        for step in proven[:-self._keep]:
            self.delete(step)

    def set_aside_diverged(self, first_bad: int | None) -> str:
        """Renames checkpoints from step `first_bad` on to `<step>.diverged` (their parameters led to
        a non-finite loss: resuming from them would diverge at once); says what is left."""
        self.wait()
        condemned = [s for s in self.all_steps() if first_bad is not None and s >= first_bad]
        for step in condemned:
            self._move_aside(step, "diverged", faults.DIVERGED_SUFFIX, reason="diverged")
        newest = self.latest_step()
        as_what = (f"with a record <step>{faults.DIVERGED_SUFFIX}.json in {self.directory} (its "
                   "objects stay until the step is saved again)"
                   if storage.is_url(self.directory) else f"as <step>{faults.DIVERGED_SUFFIX}")
        moved = (f"checkpoint{'s' if len(condemned) > 1 else ''} "
                 f"{', '.join(map(str, condemned))} set aside {as_what}; "
                 if condemned else "")
        kept = (f"the newest good checkpoint is step {newest}" if newest is not None
                else "no good checkpoint has been saved")
        return moved + kept

    def delete(self, step: int) -> None:
        """Removes a saved step (fine-tuning keeps only its best and its latest checkpoint)."""
        with self._deadlines.call(f"delete checkpoint {step} from"):
            self._manager.delete(step)

    def restore(self, step: int, abstract_state: Any) -> tuple[Any, dict]:
        """The state at `step`, laid out as `abstract_state` says (ShapeDtypeStructs with shardings)."""
        try:
            return reading.restore_checked(self._manager, self._deadlines, step,
                                           abstract_state)
        except reading.Unreadable as e:
            raise UserError(f"checkpoint {step} in {self.directory} is unreadable ({e})") from None

    def restore_latest(self, abstract_state: Any) -> tuple[int, Any, dict] | None:
        """(step, state, data state) of the newest checkpoint that reads, or None if there is none.

        Unreadable checkpoints are set aside as `<step>.unreadable` (never deleted) and the next
        older one is tried; a checkpoint of another model raises UserError and nothing is moved.
        """
        failures: list[tuple[int, str, str]] = []  # step, reason, the note on where it went
        for step in sorted(self.all_steps(), reverse=True):
            reason = None
            try:
                state, data = reading.restore_checked(self._manager, self._deadlines, step,
                                           abstract_state)
            except reading.Unreadable as e:
                reason = str(e)
            reason = reading.agreed_failure(reason)
            if reason is None:
                self._report_fallbacks(failures, step)
                return step, state, data
            where = self._move_aside(step, f"unreadable ({reason})", reason=reason)
            failures.append((step, reason, where))
        if failures:
            listed = "; ".join(f"checkpoint {s}: {r}" for s, r, _ in failures)
            kept = (f" (each set aside: its objects stay, {self.directory}/<step>"
                    f"{faults.UNREADABLE_SUFFIX}.json says why)"
                    if storage.is_url(self.directory) and not self.read_only else "")
            raise UserError(f"no checkpoint in {self.directory} restores: {listed}{kept}")
        return None

    def refuse_another_model(self, abstract_state: Any) -> None:
        """restore_latest's check of the model, alone: UserError when the newest checkpoint whose
        metadata reads is of another model shape. No array is read and nothing moved, so a run
        can be refused before it spends minutes compiling."""
        for step in sorted(self.all_steps(), reverse=True):
            try:
                saved = reading.state_metadata(self._manager, self._deadlines, step)
            except reading.Unreadable:  # restore_latest sets it aside and tries the next
                continue
            faults.check_compatible(saved, abstract_state, self.directory)
            return

    def wait(self) -> None:
        if self._failure is None:
            with self._write_errors():
                self._manager.wait_until_finished()
            self._deadlines.saved()

    def close(self) -> None:
        if self._deadlines.remote and not storage.answered_so_far(self.directory):
            return  # its writes would each wait out the timeout; the failure is reported
        if self._failure is not None:
            # Already reported; Orbax re-raises the same failure from every later wait.
            with contextlib.suppress(Exception):
                self._manager.close()
            return
        with self._write_errors():
            self._manager.close()
        self._deadlines.saved()

    def __enter__(self) -> "Checkpointer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _refuse_non_finite(self, step: int, state: Any, loss: Any) -> None:
        bad = faults.non_finite_flags(state, loss)
        if not bad:
            return
        self.wait()  # so the checkpoint named below is really on disk
        what = "the loss became" if bad & 2 else "parameters became"
        raise NonFiniteLossError(f"{what} non-finite by step {step}", step - 1 if bad & 2 else step)

    @contextlib.contextmanager
    def _write_errors(self):
        try:
            yield
        except Exception as e:
            reason = faults.write_failure_reason(e)
            if reason is None or self._saving_step is None:
                raise
            step = self._saving_step
            if self._deadlines.remote and "storage server" in reason:
                storage.mark_unanswering(self.directory)
            if jax.process_index() == 0:
                faults.remove_partial_save(self.directory, step)
            with contextlib.suppress(Exception):
                self._manager.reload()  # forget the step that never made it to disk
            line = faults.describe_write_failure(step, self.directory, reason)
            if self._deadlines.remote:  # the same account the storage deadline gives
                line += "; " + unsaved(step, self.directory, self._restorable)
            self._failure = CheckpointWriteError(line)
            self._failure.says_what_is_left = self._deadlines.remote
            raise self._failure from None

    def _move_aside(self, step: int, what: str, suffix: str = faults.UNREADABLE_SUFFIX, *,
                    reason: str) -> str:
        """Sets `step` aside (process 0); the note a line about it adds ("" when nothing moved)."""
        if self.read_only:
            self._skipped.add(step)
            return ""
        note = ""
        if jax.process_index() == 0:
            try:
                where = faults.set_aside(self.directory, step, suffix, reason)
            except OSError as e:
                raise UserError(f"checkpoint {step} in {self.directory} is {what} "
                                f"and cannot be renamed aside: {e.strerror}") from None
            except UserError as e:  # a bucket's request refused or unanswered
                raise UserError(f"checkpoint {step} in {self.directory} is {what} "
                                f"and cannot be set aside: {e}") from None
            note = faults.set_aside_note(self.directory, step, where)
        _sync_processes(f"bertjax_checkpoint_set_aside_{step}")
        with self._deadlines.call("list the checkpoints in"):
            self._manager.reload()
        return note

    def _report_fallbacks(self, failures: list[tuple[int, str, str]], step: int) -> None:
        if jax.process_index() != 0:
            return
        verb = "using" if self.read_only else "resuming from"
        for bad, reason, where in failures:
            print(f"checkpoint {bad} is unreadable ({reason}); {verb} {step}{where}",
                  file=sys.stderr, flush=True)


def _sync_processes(name: str) -> None:
    if jax.process_count() > 1:
        multihost_utils.sync_global_devices(name)
