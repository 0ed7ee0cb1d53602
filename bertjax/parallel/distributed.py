"""Multi-process start-up: `jax.distributed.initialize` when the environment describes a job of
several processes (TPU pod slices, SLURM, or explicit variables); a no-op for one process.

Explicit variables (GPU clusters, tests on one machine):
    JAX_COORDINATOR_ADDRESS=host:port  JAX_NUM_PROCESSES=N  JAX_PROCESS_ID=i
    [JAX_LOCAL_DEVICE_IDS=0,1,...]
"""

from __future__ import annotations

import os

import jax

from bertjax.errors import UserError


def _multi_host_tpu() -> bool:
    hosts = os.environ.get("TPU_WORKER_HOSTNAMES", "")
    return len([h for h in hosts.split(",") if h]) > 1


def _slurm_job() -> bool:
    return int(os.environ.get("SLURM_NTASKS", "1") or 1) > 1 and "SLURM_PROCID" in os.environ


def initialize_from_environment() -> bool:
    """Initializes the distributed runtime if the environment asks for it; True if it did."""
    if jax.distributed.is_initialized():
        return False
    address = os.environ.get("JAX_COORDINATOR_ADDRESS")
    if address:
        try:
            count = int(os.environ["JAX_NUM_PROCESSES"])
            index = int(os.environ["JAX_PROCESS_ID"])
        except (KeyError, ValueError):
            raise UserError("JAX_COORDINATOR_ADDRESS is set, so JAX_NUM_PROCESSES and "
                            "JAX_PROCESS_ID must be integers too") from None
        local = os.environ.get("JAX_LOCAL_DEVICE_IDS")
        local_ids = [int(i) for i in local.split(",")] if local else None
        jax.distributed.initialize(coordinator_address=address, num_processes=count,
                                   process_id=index, local_device_ids=local_ids)
        return True
    if _multi_host_tpu() or _slurm_job():
        # Both are detected by JAX itself (TPU metadata, SLURM variables).
        jax.distributed.initialize()
        return True
    return False
