"""The pretraining job: settings -> prepared data, model and sharded state -> the loop, resumable.

Resume order: the workdir's newest readable checkpoint (state and data iterator), else the
parameters of `init_checkpoint`, else a fresh initialization. This driver makes every check that
needs no write, opens the workdir, prepares the corpus and settles the encoder and the run record;
the run itself (compiled steps, state, loop) is a PretrainRun (pretrain_run.py).
"""

from __future__ import annotations

import dataclasses
import os
import sys

import jax

from bertjax.core.errors import UserError
from bertjax.inference import loading
from bertjax.jobs import common, pretraining_data, pretraining_model
from bertjax.jobs.pretrain_run import PretrainRun
from bertjax.jobs.run_directory import RunDirectory
from bertjax.parallel import distributed, partitioning
from bertjax.settings.pretrain import PretrainSettings
from bertjax.settings.shared import layout_of


def run(s: PretrainSettings, workdir: str) -> dict:
    """Runs (or resumes) pretraining; returns the last logged metrics."""
    with common.stop_requests() as stop:
        return _run(s, workdir, stop)


def _run(s: PretrainSettings, workdir: str, stop) -> dict:
    mesh = s.mesh.make()
    common.check_batch_split(mesh, batch_size=s.train.batch_size // s.train.accumulation_steps)
    run_dir = RunDirectory(workdir)
    run_dir.check({"task": "pretrain", "objective": s.objective.name})
    done = max(loading.checkpoint_steps(run_dir.path), default=0)
    if done >= s.train.steps:
        if jax.process_index() == 0:
            print(f"nothing to do: the run in {run_dir.path} already reached step "
                  f"{s.train.steps}", file=sys.stderr)
        return {}
    source = loading.describe(s.init_checkpoint) if s.init_checkpoint else None
    required = _required_tokenizer(s, source)
    _check_model(s, source, required)
    pretraining_data.check_existing(s, run_dir.path, required)
    if source is not None and not done:  # a resumed run has its own parameters
        source = loading.load(s.init_checkpoint)
    with run_dir:
        prepared = _prepared_corpus(s, run_dir.path, required)
        tokenizer = prepared.tokenizer
        encoder = s.model.encoder(tokenizer.vocab_size, tokenizer.special.pad,
                                  source.encoder if source is not None else None)
        compared, info = _record(s, run_dir.path, encoder)
        run_dir.check(compared)
        share = partitioning.process_batch_slice(mesh)
        data = pretraining_data.batches(s, prepared, process_index=share.index,
                                        process_count=share.count)
        run = PretrainRun(s, run_dir, mesh, encoder, data, source)
        try:
            return run.train(stop, compared, info)
        finally:
            run.close()


def _prepared_corpus(s: PretrainSettings, workdir: str, required):
    """The workdir's prepared corpus; with several processes, process 0 prepares a missing one
    while the others wait, then every process reads it."""
    distributed.check_shared_directory(workdir, "workdir")
    distributed.run_on_process_zero(
        lambda: pretraining_data.prepared_corpus(s, workdir, required), "preparing the corpus")
    return pretraining_data.prepared_corpus(s, workdir, required,
                                            may_prepare=jax.process_index() == 0)


def _record(s: PretrainSettings, workdir: str, encoder) -> tuple[dict, dict]:
    """(compared, info) of run.json."""
    compared = {"task": "pretrain", "model": layout_of(encoder), "objective": s.objective.name,
                **pretraining_model.compared_layout(s, encoder)}
    info = {"encoder": dataclasses.asdict(encoder), "task": "pretrain",
            "heads": pretraining_model.heads_record(s, encoder),
            "tokenizer_dir": os.path.join(s.data.prepared_dir(workdir), "tokenizer")}
    return compared, info


def _required_tokenizer(s: PretrainSettings, source: loading.Loaded | None):
    """The init checkpoint's own tokenizer when model.preset=from_checkpoint, else None."""
    if source is None or not s.model.from_checkpoint:
        return None
    if not source.has_tokenizer:
        if not s.data.tokenizer:
            raise UserError(f"the init checkpoint {s.init_checkpoint} keeps no tokenizer; set "
                            "--config.data.tokenizer to its vocabulary")
        return None
    return source.tokenizer()


def _check_model(s: PretrainSettings, source: loading.Loaded | None, required) -> None:
    """The model as far as it is known before the corpus is prepared (the configured vocabulary
    size, or the init checkpoint's), checked against the length schedule."""
    recorded = source.require_encoder() if s.model.from_checkpoint else None
    vocab_size = required.vocab_size if required is not None else s.data.vocab_size
    encoder = s.model.encoder(vocab_size, recorded=recorded)
    pretraining_model.generator_of(s, encoder)  # refuses a generator that does not fit
    longest = max(phase.seq_len for phase in s.schedule.phases)
    if longest > encoder.max_position_embeddings:
        raise UserError(f"schedule sequence length {longest} exceeds the model's "
                        f"max_position_embeddings {encoder.max_position_embeddings}")
