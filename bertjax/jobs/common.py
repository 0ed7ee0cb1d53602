"""What every training job does, in this order (each job's driver is a short call sequence):

    settings -> mesh -> run directory checked (no write) -> starting point read
      -> run directory opened (created, locked) -> abstract state -> compiled step(s)
      -> restore the newest readable checkpoint, or initialize (and warm-start)
      -> run record written -> hooks -> loop

Nothing is written before every check that can be made has passed; a stop request (SIGTERM)
that arrives before the first step ends the job cleanly with nothing to save.
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
from typing import Any, Callable, Iterator

import jax

from bertjax.core.errors import UserError
from bertjax.parallel import partitioning
from bertjax.train import loop
from bertjax.train.checkpoint import Checkpointer
from bertjax.train.state import StatePlan

WarmStart = Callable[[Any, Any], Any]  # (fresh params, their shardings) -> params


@dataclasses.dataclass
class Start:
    state: Any
    shardings: Any        # TrainState of shardings
    step: int             # 0 when initialized
    saved: dict           # the data state saved with the checkpoint ({} when initialized)
    abstract: Any         # the state's ShapeDtypeStructs (what the step is compiled for)


def restore_or_init(plan: StatePlan, checkpointer: Checkpointer,
                    warm_start: WarmStart | None = None) -> Start:
    """The newest checkpoint that restores completely (damaged ones are set aside), else a fresh
    state whose parameters `warm_start` may replace (the init checkpoint's)."""
    abstract, shardings = plan.abstract, plan.shardings
    restored = checkpointer.restore_latest(abstract)
    if restored is not None:
        step, state, saved = restored
        return Start(state, shardings, step, dict(saved or {}), abstract)
    state = plan.create()
    if warm_start is not None:
        state = state.replace(params=warm_start(state.params, shardings.params))
    return Start(state, shardings, 0, {}, abstract)


def check_batch_split(mesh, **batch_sizes: int) -> None:
    """Refuses a batch (per step) that does not split evenly over the data x fsdp shards."""
    shards = partitioning.batch_shards(mesh)
    for name, size in batch_sizes.items():
        if size % shards:
            raise UserError(f"train.{name} {size} must split into multiples of the {shards} "
                            "data x fsdp shards of the mesh")


@contextlib.contextmanager
def stop_requests() -> Iterator[loop.StopSource]:
    """SIGTERM/SIGINT caught from the job's start (not only once the loop runs), so a stop during
    start-up or compilation ends the job cleanly instead of killing it."""
    stop = loop.default_stop_source()
    with stop:
        yield stop


def stopped_before_start(stop: loop.StopSource) -> bool:
    if not getattr(stop, "requested", False):
        return False
    if jax.process_index() == 0:
        print(f"{stop.signal_name}: stopped before the first step; nothing to save (the same "
              "command starts or resumes the run)", file=sys.stderr)
    return True
