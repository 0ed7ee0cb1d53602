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

from bertjax.core import storage
from bertjax.core.errors import UserError
from bertjax.data import corpus
from bertjax.inference import loading
from bertjax.jobs import common, pretraining_data, pretraining_model, remote_inputs
from bertjax.jobs.pretrain_run import PretrainRun
from bertjax.jobs.run_directory import RunDirectory
from bertjax.parallel import distributed, partitioning, peer_loss
from bertjax.settings import pretrain as pretrain_settings
from bertjax.settings.pretrain import PretrainSettings
from bertjax.settings.shared import layout_of


def run(s: PretrainSettings, workdir: str) -> dict:
    """Runs (or resumes) pretraining; returns the last logged metrics."""
    with common.stop_requests() as stop:
        # inputs on a bucket, read through local copies; a prepared corpus there, in place
        inputs = remote_inputs.localized(s, stream_prepared=True)
        with inputs.named_errors():
            return _run(s, inputs, workdir, stop)


def _run(given: PretrainSettings, inputs: remote_inputs.LocalInputs, workdir: str, stop) -> dict:
    s = inputs.settings
    mesh = s.mesh.make()
    common.check_batch_split(mesh, batch_size=s.train.batch_size // s.train.accumulation_steps)
    run_dir = RunDirectory(workdir)
    run_dir.check({"task": "pretrain", "objective": s.objective.name})
    done = max(loading.checkpoint_steps(run_dir.checkpoints), default=0)
    if done >= s.train.steps:
        if jax.process_index() == 0:
            print(f"nothing to do: the run in {run_dir.location} already reached step "
                  f"{s.train.steps}", file=sys.stderr)
        return {}
    source = loading.describe(s.init_checkpoint) if s.init_checkpoint else None
    required = _required_tokenizer(s, source)
    _check_model(s, source, required)
    pretraining_data.check_existing(s, run_dir.path, required)
    pretrain_settings.check_read_cache(s.data, s.train.batch_size,
                                       max(phase.seq_len for phase in s.schedule.phases),
                                       workdir=run_dir.location)
    # The process that prepares a missing corpus checks what it would read; the others wait
    # for its verdict (a refusal on process 0 alone would leave them waiting for it).
    distributed.run_on_process_zero(lambda: pretraining_data.check_inputs(s, run_dir.path),
                                    "checking the corpus inputs")
    if source is not None and not done:  # a resumed run has its own parameters
        source = loading.load(s.init_checkpoint)
    with run_dir:
        prepared = _prepared_corpus(inputs, run_dir, required)
        tokenizer = prepared.tokenizer
        encoder = s.model.encoder(tokenizer.vocab_size, tokenizer.special.pad,
                                  source.encoder if source is not None else None)
        compared, info = _record(given, run_dir.location, encoder)
        run_dir.check(compared)

        def data(fitted_mesh):  # the mesh train.fit chose: each process's rows of a batch
            share = partitioning.process_batch_slice(fitted_mesh)
            return pretraining_data.batches(s, prepared, process_index=share.index,
                                            process_count=share.count)
        run = PretrainRun(s, run_dir, encoder, data, source)
        try:
            with peer_loss.leaving_on_loss():  # before the clean-up below: it is bounded too
                return run.train(stop, compared, info)
        finally:
            run.close()


def _prepared_corpus(inputs: remote_inputs.LocalInputs, run_dir: RunDirectory, required):
    """The workdir's prepared corpus; with several processes, process 0 prepares a missing one
    while the others wait, then every process reads it. A workdir (or data.prepared) on a bucket
    is shared by definition: process 0 uploads what it prepared and the others fetch it."""
    s, workdir = _in_place(inputs.settings, run_dir), run_dir.path
    if not run_dir.remote:  # checkpoints and records: every host must see one workdir
        distributed.check_shared_directory(workdir, "workdir")

    def prepare():
        prepared = pretraining_data.prepared_corpus(s, workdir, required)
        remote_inputs.upload_prepared(inputs)
        run_dir.push()
        return prepared
    prepared = distributed.run_on_process_zero(prepare, "preparing the corpus")
    if prepared is not None:  # process 0's, opened already (a streamed one's index fetched)
        return prepared
    if jax.process_index() != 0:
        run_dir.pull()
        s = _in_place(s, run_dir)
        if inputs.upload_prepared_to is not None:
            s = remote_inputs.localized(dataclasses.replace(
                s, data=dataclasses.replace(s.data, prepared=inputs.upload_prepared_to)),
                stream_prepared=True).settings
    return pretraining_data.prepared_corpus(s, workdir, required,
                                            may_prepare=jax.process_index() == 0)


def _in_place(s: PretrainSettings, run_dir: RunDirectory) -> PretrainSettings:
    """A corpus prepared into a workdir on a bucket comes into the mirror without its shards
    (workdir_mirror.READ_IN_PLACE): its manifest there means it is read in place."""
    if not run_dir.remote or s.data.prepared or not os.path.exists(
            os.path.join(s.data.prepared_dir(run_dir.path), corpus.MANIFEST)):
        return s
    inside = os.path.relpath(s.data.prepared_dir(run_dir.path), run_dir.path)  # "data"
    in_place = storage.join(run_dir.location, inside)
    return dataclasses.replace(s, data=dataclasses.replace(s.data, prepared=in_place))


def _record(s: PretrainSettings, workdir: str, encoder) -> tuple[dict, dict]:
    """(compared, info) of run.json."""
    compared = {"task": "pretrain", "model": layout_of(encoder), "objective": s.objective.name,
                **pretraining_model.compared_layout(s, encoder)}
    info = {"encoder": encoder.record(), "task": "pretrain",
            "heads": pretraining_model.heads_record(s, encoder),
            "tokenizer_dir": storage.join(s.data.prepared_dir(workdir), "tokenizer")}
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
    pretraining_model.check_decoder(s, encoder)
    longest = max(phase.seq_len for phase in s.schedule.phases)
    if longest > encoder.max_sequence_length:
        raise UserError(f"schedule sequence length {longest} exceeds the model's "
                        f"{encoder.max_sequence_length} positions (max_position_embeddings "
                        f"{encoder.max_position_embeddings})")
