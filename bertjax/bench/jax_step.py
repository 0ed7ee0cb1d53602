"""Our pretraining train step, built as the job builds it, on a synthetic batch of its schema.

The step is the real one (`make_train_step` on the objective's model and loss, BERT's heads or
ELECTRA's generator and discriminator; the config's optimizer, mesh, dtype, scan and remat
settings), compiled ahead of time; only the data is synthetic, so the figures measure the model
and the step, not the input pipeline. The analytic FLOPs are the encoder's (an ELECTRA
generator's are not counted).
"""

from __future__ import annotations

import dataclasses
import resource
from typing import Any

import jax
import numpy as np

from bertjax.bench.flops import xla_flops
from bertjax.data import schema
from bertjax.data.tokenizer import CLS, MASK, SEP, SPECIAL_TOKENS
from bertjax.jobs import pretraining_model
from bertjax.core.errors import UserError
from bertjax.model.config import EncoderConfig
from bertjax.model.flops import StepFlops, train_step_flops
from bertjax.parallel import partitioning
from bertjax.train.compilation import abstract_batch, compile_step, memory_report
from bertjax.train.optimizer import make_optimizer
from bertjax.settings import PretrainSettings
from bertjax.train.state import StatePlan, param_count
from bertjax.train.step import make_train_step


@dataclasses.dataclass(frozen=True)
class Workload:
    batch: int  # global, sequences a step
    seq_len: int
    predictions: int  # masked positions a sequence

    @property
    def tokens(self) -> int:
        return self.batch * self.seq_len


def synthetic_batch(workload: Workload, vocab_size: int, *, nsp: bool, span: bool,
                    seed: int = 0) -> dict[str, np.ndarray]:
    """A full-length `[CLS] A [SEP] B [SEP]` batch of random non-special ids, every prediction
    slot used (`bertjax.data.schema`'s batch; our vocabularies put the special tokens at 0-4)."""
    b, t, p = workload.batch, workload.seq_len, workload.predictions
    special = {token: i for i, token in enumerate(SPECIAL_TOKENS)}
    rng = np.random.default_rng(seed)
    ids = rng.integers(len(SPECIAL_TOKENS), vocab_size, (b, t)).astype(np.int32)
    rows = np.arange(b)
    boundary = rng.integers(t // 4, 3 * t // 4, b)
    ids[:, 0] = special[CLS]
    ids[rows, boundary] = special[SEP]
    ids[:, -1] = special[SEP]
    segments = (np.arange(t)[None, :] > boundary[:, None]).astype(np.int32)
    positions = np.stack([
        np.sort(rng.choice(np.setdiff1d(np.arange(1, t - 1), [boundary[r]]), p, replace=False))
        for r in rows]).astype(np.int32)
    masked_ids = ids[rows[:, None], positions]
    ids[rows[:, None], positions] = special[MASK]
    batch = {"input_ids": ids, "segment_ids": segments, "input_mask": np.ones((b, t)),
             "masked_positions": positions, "masked_ids": masked_ids,
             "masked_weights": np.ones((b, p))}
    if nsp:
        batch["nsp_label"] = rng.integers(0, 2, b)
    if span:  # each masked token a one-token span
        batch.update(span_left=positions - 1, span_right=positions + 1,
                     span_offset=np.zeros((b, p)))
    return schema.conform(batch, b, t, p, nsp=nsp, span=span)


class JaxStep:
    """Builds, compiles and steps our train step; `step()` runs one update to completion."""

    def __init__(self, s: PretrainSettings, workload: Workload):
        objective = s.objective
        self.encoder: EncoderConfig = s.model.encoder(s.data.vocab_size)
        _check_workload(workload, self.encoder)
        self.workload = workload
        self.flops: StepFlops = train_step_flops(self.encoder, workload.batch, workload.seq_len,
                                                 workload.predictions, nsp=objective.nsp,
                                                 sbo=objective.sbo,
                                                 decoder_passes=s.model.enhanced_mask_decoder)
        # The job's model and loss: BERT's heads, or ELECTRA's generator and discriminator.
        model, step_objective = pretraining_model.build(s, self.encoder)
        optimizer = make_optimizer(s.optimizer)
        self.mesh = s.mesh.make()
        shards = partitioning.batch_shards(self.mesh)
        if workload.batch % (shards * s.train.accumulation_steps):
            raise UserError(f"--batch {workload.batch} must be a multiple of the {shards} data x "
                            f"fsdp shards times train.accumulation_steps")
        span = s.masking.strategy == "span"
        shapes = abstract_batch(workload.batch, workload.seq_len, workload.predictions,
                              nsp=objective.nsp, span=span,
                              sharding=partitioning.batch_sharding(self.mesh))
        plan = StatePlan(model, optimizer, shapes, self.mesh, s.train.seed)
        abstract, shardings = plan.abstract, plan.shardings
        train_step = make_train_step(model, optimizer, self.mesh, shardings,
                                     accumulation_steps=s.train.accumulation_steps,
                                     objective=step_objective)
        # Compiled from shapes, as the job does: a step that does not fit the device is refused
        # before its state is allocated.
        self.compiled = compile_step(
            train_step, abstract, shapes, name="benchmark step", verbose=False,
            device_memory_gb=s.train.device_memory_gb)
        self.compile_seconds: float = self.compiled.compile_seconds
        self.state = plan.create()
        self.params = param_count(self.state.params)
        self.xla_flops = xla_flops(self.compiled)
        self.batch_np = synthetic_batch(workload, self.encoder.vocab_size, nsp=objective.nsp,
                                        span=span, seed=s.train.seed)
        self.batch = partitioning.global_batch(_local_rows(self.batch_np, self.mesh), self.mesh)
        self._metrics: Any = None

    def step(self) -> None:
        self.state, self._metrics = self.compiled(self.state, self.batch)
        jax.block_until_ready((self.state, self._metrics))

    def last_loss(self) -> float:
        return float(self._metrics["loss"])

    def peak_memory(self) -> tuple[int, str]:
        """Peak bytes of one device, and where the figure comes from."""
        stats = _device_stats()
        if stats and "peak_bytes_in_use" in stats:
            return int(stats["peak_bytes_in_use"]), "device memory_stats() peak_bytes_in_use"
        peak = memory_report(self.compiled).get("peak", 0)
        if peak:
            return peak, ("compiled memory_analysis(): arguments + outputs - donated + "
                          "temporaries, per device")
        return process_peak_rss(), "process RSS high-water mark"


def process_peak_rss() -> int:
    """This process's resident-set high-water mark in bytes (Linux reports KiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


def _device_stats() -> dict | None:
    try:
        return jax.local_devices()[0].memory_stats()
    except Exception:  # CPU and some backends have none
        return None


def _check_workload(workload: Workload, encoder: EncoderConfig) -> None:
    if workload.seq_len > encoder.max_position_embeddings:
        raise UserError(f"--seq-len {workload.seq_len} exceeds model.max_position_embeddings "
                        f"{encoder.max_position_embeddings}")
    if workload.seq_len < 8:
        raise UserError(f"--seq-len must be at least 8, got {workload.seq_len}")
    if encoder.vocab_size <= len(SPECIAL_TOKENS):
        raise UserError(f"data.vocab_size {encoder.vocab_size} leaves no room beside the "
                        f"{len(SPECIAL_TOKENS)} special tokens")
    if not 0 < workload.predictions <= workload.seq_len - 3:
        raise UserError(f"--predictions must be in [1, {workload.seq_len - 3}] (the sequence "
                        f"minus [CLS] and two [SEP]), got {workload.predictions}")


def _local_rows(batch: dict[str, np.ndarray], mesh) -> dict[str, np.ndarray]:
    """This process's share of the global batch (every process builds the same one)."""
    share = partitioning.process_batch_slice(mesh)
    rows = next(iter(batch.values())).shape[0] // share.count
    return {k: v[share.index * rows:(share.index + 1) * rows] for k, v in batch.items()}
