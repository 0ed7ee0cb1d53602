"""Multi-process runs: start-up from the environment, and the decisions processes take together.

`initialize_from_environment()` calls `jax.distributed.initialize` when the environment describes
a job of several processes, and is a no-op otherwise:

- Explicit variables (GPU clusters, `launch/local.sh`, tests on one machine):
      JAX_COORDINATOR_ADDRESS=host:port  JAX_NUM_PROCESSES=N  JAX_PROCESS_ID=i
      [JAX_LOCAL_DEVICE_IDS=0,1,...]  (default: every local device)
- A Cloud TPU VM: JAX reads the worker list from the VM's metadata (one or several hosts; where
  that fails on a single host, it runs alone).
- Inside a SLURM step of several tasks (`srun`): JAX reads the SLURM variables and, on GPUs,
  gives each task one device (its SLURM_LOCALID); `launch/slurm_gpu.sbatch` instead sets the
  explicit variables and runs one process per node over all of its GPUs.

A lost process (a host preempted or killed) ends the others within BERTJAX_PEER_TIMEOUT seconds
(`bertjax.parallel.peer_loss`).

Everything else here keeps several processes in step: work done once by process 0 with its
outcome (or error) shared, a check that a directory is really shared, and a SIGTERM stop agreed
on by every process.
"""

from __future__ import annotations

import os
import secrets
import signal
import sys
from typing import Callable, TypeVar

import jax
import numpy as np
from jax._src import cloud_tpu_init  # no public equivalent of these two
from jax._src import distributed as jax_distributed
from jax.experimental import multihost_utils

from bertjax.core.errors import UserError
from bertjax.parallel import peer_loss

_T = TypeVar("_T")
_TEXT_BYTES = 2048  # longest message shared between processes


_EXPLICIT = ("JAX_NUM_PROCESSES", "JAX_PROCESS_ID", "JAX_LOCAL_DEVICE_IDS")


def _whole_number(name: str, minimum: int) -> int:
    """The variable `name` as a whole number >= minimum (digits only: no sign, point or blank)."""
    raw = os.environ.get(name, "")
    if not (raw.isascii() and raw.isdigit() and int(raw) >= minimum):
        kind = "a positive whole number" if minimum else "a whole number >= 0"
        raise UserError(f"{name}={raw!r} must be {kind}")
    return int(raw)


def _explicit_settings() -> dict | None:
    """The JAX_* variables, checked; None when none of them is set."""
    address = os.environ.get("JAX_COORDINATOR_ADDRESS", "").strip()
    if not address:
        stray = [name for name in _EXPLICIT if os.environ.get(name, "").strip()]
        if stray:
            raise UserError(f"{stray[0]} is set but JAX_COORDINATOR_ADDRESS is not: a "
                            "multi-process job needs JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES "
                            "and JAX_PROCESS_ID")
        return None
    host, _, port = address.rpartition(":")
    if not host or not (port.isascii() and port.isdigit()) or not 0 < int(port) < 65536:
        raise UserError(f"JAX_COORDINATOR_ADDRESS={address!r} must be host:port")
    count = _whole_number("JAX_NUM_PROCESSES", 1)
    index = _whole_number("JAX_PROCESS_ID", 0)
    if index >= count:
        raise UserError(f"JAX_PROCESS_ID={index} must be less than JAX_NUM_PROCESSES={count}")
    local = os.environ.get("JAX_LOCAL_DEVICE_IDS", "").strip()
    ids = [i.strip() for i in local.split(",")] if local else []
    if not all(i.isascii() and i.isdigit() for i in ids):
        raise UserError(f"JAX_LOCAL_DEVICE_IDS={local!r} must be comma-separated whole numbers "
                        ">= 0")
    # "deactivate": the values above are the whole truth. Otherwise JAX fills in the unset
    # local_device_ids from SLURM (one device per task), so one process per node would see
    # only its first GPU.
    return dict(coordinator_address=address, num_processes=count, process_id=index,
                local_device_ids=[int(i) for i in ids] or None,
                cluster_detection_method="deactivate")


def _inside_multi_task_slurm_step() -> bool:
    # SLURM_STEP_NODELIST exists only inside `srun`: in the batch script itself a lone process
    # must not wait for the other tasks.
    if "SLURM_STEP_NODELIST" not in os.environ or "SLURM_PROCID" not in os.environ:
        return False
    name = next((n for n in ("SLURM_STEP_NUM_TASKS", "SLURM_NTASKS") if os.environ.get(n)), None)
    return name is not None and _whole_number(name, 1) > 1


def _on_cloud_tpu_vm() -> bool:
    # Set by `import jax` when TPU chips and libtpu are present (no public equivalent).
    return bool(getattr(cloud_tpu_init, "running_in_cloud_tpu_vm", False))


def initialize_from_environment() -> bool:
    """Initializes the distributed runtime if the environment asks for it; True if it did.

    Must run before anything touches a JAX device. Failing to join the job (wrong address, a
    missing process, a timeout) is a UserError naming the settings used.
    """
    if jax.distributed.is_initialized():
        return False
    settings = _explicit_settings()
    timeouts = peer_loss.initialize_timeouts()  # checked before any process waits for another
    if settings is not None:
        where = (f"{settings['coordinator_address']} as process {settings['process_id']} of "
                 f"{settings['num_processes']}")
        try:
            jax.distributed.initialize(**settings, **timeouts)
        except (RuntimeError, ValueError) as e:
            raise UserError(f"could not join the distributed job at {where}: "
                            f"{_first_line(e)}") from None
        return _watched()
    if _inside_multi_task_slurm_step():
        try:
            jax.distributed.initialize(**timeouts)
        except (RuntimeError, ValueError) as e:
            raise UserError(f"could not join the SLURM job's processes: {_first_line(e)}") from None
        return _watched()
    if _on_cloud_tpu_vm():
        return _initialize_on_tpu_vm(timeouts)
    return False


def _initialize_on_tpu_vm(timeouts: dict) -> bool:
    # JAX reads the worker list from the VM's metadata server. Where that fails (a TPU VM
    # without it, such as some notebook runtimes) one host may still run alone; a pod slice
    # may not: its processes must agree on checkpoints and stops.
    try:
        jax.distributed.initialize(**timeouts)
    except Exception as e:  # requests' network errors as well as JAX's own
        if jax.process_count() > 1:
            raise UserError("could not start jax.distributed on this TPU pod slice "
                            f"({jax.process_count()} hosts): {_first_line(e)}") from None
        print(f"bertjax: warning: jax.distributed.initialize() failed on this TPU VM "
              f"({_first_line(e)}); running as one process", file=sys.stderr, flush=True)
        return False
    return _watched()


def _watched() -> bool:
    """Joined: a peer that falls silent ends this process (peer_loss.PeerWatch)."""
    peer_loss.watch(jax_distributed.global_state.client)
    return True


def _first_line(error: BaseException) -> str:
    text = str(error).strip()
    return text.splitlines()[0] if text else type(error).__name__


def is_multi_process() -> bool:
    return jax.process_count() > 1


def _share_text(text: str) -> str:
    """Process 0's `text` on every process (a collective: every process must call it)."""
    data = text.encode("utf-8")[:_TEXT_BYTES]
    buffer = np.zeros(_TEXT_BYTES + 1, np.int32)
    buffer[0] = len(data)
    buffer[1:1 + len(data)] = np.frombuffer(data, np.uint8)
    shared = np.asarray(multihost_utils.broadcast_one_to_all(buffer))
    return bytes(shared[1:1 + int(shared[0])].astype(np.uint8)).decode("utf-8", "replace")


def run_on_process_zero(fn: Callable[[], _T], what: str) -> _T | None:
    """Runs `fn` on process 0 while the others wait; returns its result there (None elsewhere).

    A UserError on process 0 is raised on every process with the same message, so all of them
    exit 2 together instead of the others waiting for a process that has gone. With one process
    this is just `fn()`.
    """
    if not is_multi_process():
        return fn()
    result, error = None, ""
    failure: BaseException | None = None
    if jax.process_index() == 0:
        try:
            result = fn()
        except UserError as e:
            error = str(e)
        except Exception as e:  # a bug: tell the others, then fail here with its traceback
            error, failure = f"process 0 failed while {what}: {type(e).__name__}: {e}", e
    error = _share_text(error)
    if failure is not None:
        raise failure
    if error:
        raise UserError(error)
    return result


def any_process(flag: bool) -> bool:
    """True on every process when `flag` is true on at least one (a collective)."""
    if not is_multi_process():
        return bool(flag)
    return bool(np.any(multihost_utils.process_allgather(np.int32(bool(flag)))))


def check_shared_directory(path: str, what: str) -> None:
    """Refuses, on every process, a directory that the processes do not all see as one.

    Orbax writes each process's shards into the same checkpoint directory and process 0
    finalizes it; on per-host local disks that silently produces checkpoints nobody can restore.
    """
    if not is_multi_process():
        return
    probe = os.path.join(path, ".bertjax-shared-check")
    token = secrets.token_hex(8) if jax.process_index() == 0 else ""
    if token:
        with open(probe, "w") as f:
            f.write(token)
    token = _share_text(token)  # also a barrier: the probe is written before anyone reads it
    try:
        with open(probe) as f:
            sees_it = f.read() == token
    except OSError:
        sees_it = False
    anyone_blind = any_process(not sees_it)
    if jax.process_index() == 0:
        os.remove(probe)
    if anyone_blind:
        raise UserError(f"the {what} {path} is not shared by all {jax.process_count()} "
                        "processes: with several hosts it must be on a file system every host "
                        "mounts at the same path (NFS, a gcsfuse bucket, Filestore)")


class PreemptionSync:
    """The loop's stop source in multi-process runs: stop at a step all processes agree on.

    A SIGTERM (a preemption notice, `scancel`, a time limit) may reach the processes at different
    steps, and a process that checkpoints and leaves alone deadlocks the rest in their next
    collective. JAX's preemption sync manager (started by `jax.distributed.initialize`) catches
    SIGTERM on any process, tells the others, and picks the step after the furthest one; every
    process asks it once per step and all of them stop at that step. So no Python SIGTERM handler
    is installed here: it would replace the manager's. Ctrl-C is turned into a SIGTERM to this
    process, so it too stops everyone cleanly.
    """

    # Stops are agreed at step boundaries only: a request before the first step is not seen.
    requested = False

    def __init__(self):
        self.signal_name: str | None = None
        self._previous = None
        self._depth = 0  # entered by the job and again by the loop

    def _interrupt(self, signum, frame) -> None:
        os.kill(os.getpid(), signal.SIGTERM)

    def __enter__(self) -> "PreemptionSync":
        self._depth += 1
        if self._depth > 1:
            return self
        if jax_distributed.global_state.preemption_sync_manager is None:
            raise UserError("a multi-process run needs JAX's preemption service to stop cleanly "
                            "on SIGTERM: do not set jax_enable_preemption_service=False")
        try:
            self._previous = signal.signal(signal.SIGINT, self._interrupt)
        except ValueError:  # not the main thread: leave Ctrl-C alone
            self._previous = None
        return self

    def __exit__(self, *exc) -> None:
        self._depth -= 1
        if self._depth == 0 and self._previous is not None:
            signal.signal(signal.SIGINT, self._previous)
            self._previous = None

    def should_stop(self, step: int) -> bool:
        """Called by every process after every step; True at the agreed stop step."""
        if multihost_utils.reached_preemption_sync_point(step):
            self.signal_name = "a preemption notice (SIGTERM) to one of the processes"
            return True
        return False

