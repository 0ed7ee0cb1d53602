"""The pretraining job: settings -> prepared data, model and sharded state -> the loop, resumable.

Resume order: the workdir's newest readable checkpoint (state and data iterator), else the
parameters of `init_checkpoint`, else a fresh initialization.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import jax

from bertjax.inference import loading
from bertjax.data.schema import abstract_batch
from bertjax.core.errors import UserError
from bertjax.jobs import common, pretraining_data, pretraining_model
from bertjax.jobs.run_directory import RunDirectory
from bertjax.parallel import distributed, partitioning
from bertjax.settings.pretrain import PretrainSettings
from bertjax.settings.shared import layout_of
from bertjax.train import loop, warm_start
from bertjax.train.checkpoint import Checkpointer
from bertjax.train.compilation import compile_step
from bertjax.train.logging_hook import LoggingHook, window_summary
from bertjax.train.metrics_log import MetricsWriter, NonFiniteLossError, truncate_after
from bertjax.train.optimizer import make_optimizer
from bertjax.train.warm_start import UNTRAINED_POOLER
from bertjax.train.plots import plot_curves
from bertjax.train.state import param_count
from bertjax.train.step import make_eval_step, make_train_step


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
    is_main = jax.process_index() == 0
    if done >= s.train.steps:
        if is_main:
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
        distributed.check_shared_directory(run_dir.path, "workdir")
        # With several processes, process 0 prepares a missing corpus while the others wait.
        distributed.run_on_process_zero(
            lambda: pretraining_data.prepared_corpus(s, run_dir.path, required), "preparing "
            "the corpus")
        share = partitioning.process_batch_slice(mesh)
        prepared = pretraining_data.prepared_corpus(s, run_dir.path, required,
                                                    may_prepare=is_main)
        tokenizer = prepared.tokenizer
        encoder = s.model.encoder(tokenizer.vocab_size, tokenizer.special.pad,
                                  source.encoder if source is not None else None)
        compared = {"task": "pretrain", "model": layout_of(encoder),
                    "objective": s.objective.name,
                    **pretraining_model.compared_layout(s, encoder)}
        run_dir.check(compared)
        data = pretraining_data.batches(s, prepared, process_index=share.index,
                                        process_count=share.count)
        return _train(s, run_dir, stop, mesh, encoder, data, source, compared, info={
            "encoder": dataclasses.asdict(encoder), "task": "pretrain",
            "heads": pretraining_model.heads_record(s, encoder),
            "tokenizer_dir": os.path.join(s.data.prepared_dir(run_dir.path), "tokenizer")})


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


def _train(s: PretrainSettings, run_dir: RunDirectory, stop, mesh, encoder, data,
           source: loading.Loaded | None, compared: dict, info: dict) -> dict:
    is_main = jax.process_index() == 0
    workdir = run_dir.path
    model, objective = pretraining_model.build(s, encoder)
    # Only NSP reads the pooled output: without it the pooler gets no gradient, only decay.
    untrained = () if s.objective.nsp else (UNTRAINED_POOLER,)
    optimizer = make_optimizer(s.optimizer, untrained=untrained)
    batch_sharding = partitioning.batch_sharding(mesh)
    span = s.masking.strategy == "span"

    def shapes_for(phase):
        return abstract_batch(s.train.batch_size, phase.seq_len, phase.max_predictions,
                              nsp=s.objective.nsp, span=span, sharding=batch_sharding)

    schedule = s.schedule
    first_shapes = shapes_for(schedule.phase_at(0))
    done = max(loading.checkpoint_steps(workdir), default=0)
    abstract, shardings = common.abstract_state(model, optimizer, first_shapes, mesh,
                                                s.train.seed)
    train_step = make_train_step(model, optimizer, mesh, shardings,
                                 accumulation_steps=s.train.accumulation_steps,
                                 objective=objective)
    # Compiled from shapes alone, before any state exists: a config that does not fit is
    # refused before a byte of it is allocated.
    compiled = {}
    for phase in schedule.phases:
        if schedule.phase_end(phase, s.train.steps) > done:
            compiled[phase.seq_len] = compile_step(
                train_step, abstract, shapes_for(phase),
                name=f"train step at {phase.seq_len} tokens", verbose=False,
                device_memory_gb=s.train.device_memory_gb)
    if is_main:  # once every phase fits: a config refused for a later one prints one line
        for step in compiled.values():
            print(step.report, file=sys.stderr, flush=True)
    if common.stopped_before_start(stop):
        return {}
    warm = None
    if source is not None and source.params is not None:
        def warm(params, param_shardings):
            return warm_start.load_params(s.init_checkpoint, source.params, params,
                                          param_shardings)
    checkpointer = Checkpointer(workdir, keep=s.train.keep_checkpoints)
    try:
        start = common.restore_or_init(model, optimizer, first_shapes, mesh, s.train.seed,
                                       checkpointer, warm)
        run_dir.write_record(compared, info)
        if is_main:
            if start.step:
                truncate_after(workdir, start.step)
                print(f"resuming from step {start.step} of {s.train.steps} "
                      f"({checkpointer.directory})", file=sys.stderr)
            print(f"model: {s.model.preset} ({param_count(start.state.params):,} parameters), "
                  f"objective {s.objective.name}, mesh {dict(mesh.shape)}", file=sys.stderr)
        if common.stopped_before_start(stop):
            return {}
        return _loop(s, workdir, stop, mesh, model, objective, start, compiled, data,
                     checkpointer)
    finally:
        checkpointer.close()


def _loop(s: PretrainSettings, workdir: str, stop, mesh, model, objective,
          start: common.Start, compiled: dict, data, checkpointer: Checkpointer) -> dict:
    is_main = jax.process_index() == 0
    schedule, total_steps = s.schedule, s.train.steps
    eval_step = make_eval_step(model, mesh, start.shardings, objective=objective)

    def step_fn(state, local_batch):
        seq_len = local_batch["input_ids"].shape[1]
        return compiled[seq_len](state, partitioning.global_batch(local_batch, mesh))

    batches = data.train_iterator(start.step)
    if start.saved:
        batches.set_state(start.saved)
    writer = MetricsWriter(workdir, enabled=is_main)
    progress = loop.Progress(start.step, total_steps, enabled=is_main)
    logger = LoggingHook(
        writer, s.train.log_every, summarize=objective.summarize,
        step_info=lambda step: {"seq_len": schedule.phase_at(step - 1).seq_len},
        tokens_in_step=lambda step: s.train.batch_size * schedule.phase_at(step - 1).seq_len,
        progress=progress)
    eval_cache: dict[int, list] = {}

    def evaluate(step, state, _metrics):
        phase = schedule.phase_at(step - 1)
        if phase.seq_len not in eval_cache:
            eval_cache[phase.seq_len] = [partitioning.global_batch(b, mesh) for b in
                                         data.eval_batches(phase, s.train.eval_batches)]
        sums = [eval_step(state.params, b) for b in eval_cache[phase.seq_len]]
        if sums:
            summary = window_summary(jax.device_get(sums), objective.summarize)
            writer.write(step, {f"eval_{k}": v for k, v in summary.items()})

    def checkpoint(step, state, metrics):
        logger.flush()
        checkpointer.save(step, state, batches.get_state(), metrics=metrics)

    hooks = [logger, loop.Every(s.train.checkpoint_every, checkpoint)]
    if s.train.eval_every and s.train.eval_batches and data.has_eval_data:
        hooks.append(loop.Every(s.train.eval_every, evaluate))
    try:
        _, last_step = loop.run(
            start.state, batches, start_step=start.step, total_steps=total_steps,
            step_fn=step_fn, hooks=hooks, on_stop=lambda step, st: checkpoint(step, st, None),
            progress=progress, stop_source=stop)
        checkpointer.wait()
    except NonFiniteLossError as e:
        left = checkpointer.set_aside_diverged(e.first_bad_checkpoint)
        raise NonFiniteLossError(f"{e}; {left}", e.first_bad_checkpoint) from None
    finally:
        batches.close()
        writer.close()
    if is_main:
        if s.train.plot:
            plot_curves(workdir)
        report_outputs(workdir, last_step, total_steps, s.train.plot)
    return logger.last_logged


def report_outputs(workdir: str, step: int, total_steps: int, plotted: bool) -> None:
    lines = [f"\nstep {step} of {total_steps}; workdir {workdir}",
             f"  checkpoints: {os.path.join(workdir, 'checkpoints')}",
             f"  metrics:     {os.path.join(workdir, 'metrics.jsonl')} "
             f"(TensorBoard: {os.path.join(workdir, 'tensorboard')})"]
    if plotted:
        lines.append(f"  curves:      {os.path.join(workdir, 'curves.png')}")
    if step < total_steps:
        lines.append("  continue:    run the same command again; it resumes from the checkpoint")
    else:
        lines += ["  fine-tune:   python -m bertjax.main --config=configs/finetune_sentiment.py "
                  f"--workdir=DIR --config.init_checkpoint={workdir}",
                  f"  export:      python -m bertjax.export --workdir {workdir} --format hf "
                  "--output DIR"]
    print("\n".join(lines), file=sys.stderr)
