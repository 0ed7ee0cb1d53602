"""The pretraining job: config -> prepared data, model and sharded state -> the loop, resumable.

Resume order: the workdir's own latest checkpoint (state and data iterator), else the parameters
of `config.init_checkpoint`, else a fresh initialization.
"""

from __future__ import annotations

import dataclasses
import os
import sys

import jax
import ml_collections

from bertjax import builders
from bertjax.model.heads import BertForPretraining
from bertjax.parallel import distributed, partitioning
from bertjax.train import loop, objectives
from bertjax.train.checkpoint import Checkpointer, latest_step
from bertjax.train.compilation import compile_step
from bertjax.train.logging_hook import LoggingHook, window_summary
from bertjax.train.metrics import MetricsWriter, truncate_after
from bertjax.train.optimizer import make_optimizer
from bertjax.train.plots import plot_curves
from bertjax.train.state import abstract_train_state, create_train_state, param_count
from bertjax.train.step import make_eval_step, make_train_step
from bertjax.train.workdir import check_run_record, ensure_writable

# Settings that change the layout of a checkpoint; anything else may differ between runs.
_LAYOUT_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                  "max_position_embeddings", "type_vocab_size", "param_dtype", "scan_layers")


def batch_shapes(global_batch: int, seq_len: int, max_predictions: int, *, nsp: bool,
                 span: bool, sharding=None) -> dict[str, jax.ShapeDtypeStruct]:
    """The batch schema of the data pipeline, as abstract global arrays."""
    import jax.numpy as jnp

    def arr(shape, dtype=jnp.int32):
        return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)

    b, length, p = global_batch, seq_len, max_predictions
    shapes = {"input_ids": arr((b, length)), "segment_ids": arr((b, length)),
              "input_mask": arr((b, length)), "masked_positions": arr((b, p)),
              "masked_ids": arr((b, p)), "masked_weights": arr((b, p), jnp.float32)}
    if nsp:
        shapes["nsp_label"] = arr((b,))
    if span:
        shapes.update(span_left=arr((b, p)), span_right=arr((b, p)), span_offset=arr((b, p)))
    return shapes


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
    """Runs (or resumes) pretraining; returns the last logged metrics."""
    # Every setting is checked before anything is written (the vocabulary size is not known until
    # the corpus is prepared, so the model is checked with the configured one first).
    builders.validate_train(config)
    objective = builders.objective(config)
    optimizer = make_optimizer(builders.optimizer_config(config))
    schedule = builders.length_schedule(config)
    builders.masking_config(config)
    builders.encoder_config(config)
    mesh = builders.mesh(config)
    workdir = ensure_writable(workdir)
    distributed.check_shared_directory(workdir, "workdir")
    total_steps = config.train.steps
    done = latest_step(workdir)
    is_main = jax.process_index() == 0
    if done is not None and done >= total_steps:
        if is_main:
            print(f"nothing to do: the run in {workdir} already reached step {total_steps}",
                  file=sys.stderr)
        return {}
    # With several processes, process 0 prepares a missing corpus while the others wait.
    distributed.run_on_process_zero(lambda: builders.prepared_corpus(config, workdir),
                                    "preparing the corpus")
    batch_slice = partitioning.process_batch_slice(mesh)
    data, tokenizer = builders.build_pretraining_data(
        config, workdir, process_index=batch_slice.index, process_count=batch_slice.count,
        may_prepare=is_main)
    encoder = builders.encoder_config(config, tokenizer.vocab_size, tokenizer.special.pad)
    layout = {k: v for k, v in dataclasses.asdict(encoder).items() if k in _LAYOUT_FIELDS}
    heads = {"nsp": objective.nsp, "sbo": objective.sbo,
             "max_span_length": config.masking.max_span_length}
    # Process 0 keeps the record; a refusal there must stop every process, not only process 0.
    distributed.run_on_process_zero(lambda: check_run_record(
        workdir, {"model": layout, "objective": objective.name}, info={
            "encoder": dataclasses.asdict(encoder), "heads": heads, "task": "pretrain",
            "tokenizer_dir": os.path.abspath(
                os.path.join(builders.prepared_dir(config, workdir), "tokenizer"))}),
        "checking the run record")

    model = BertForPretraining(encoder, nsp=objective.nsp, sbo=objective.sbo,
                               max_span_length=config.masking.max_span_length)
    span = config.masking.strategy == "span"
    batch_sharding = partitioning.batch_sharding(mesh)

    def shapes_for(phase):
        return batch_shapes(config.train.batch_size, phase.seq_len, phase.max_predictions,
                            nsp=objective.nsp, span=span, sharding=batch_sharding)

    first_shapes = shapes_for(schedule.phase_at(0))
    abstract, shardings = abstract_train_state(model, optimizer, first_shapes, mesh,
                                               config.train.seed)
    train_step = make_train_step(model, optimizer, mesh, shardings,
                                 accumulation_steps=config.train.accumulation_steps)
    # Compiled from shapes alone, before any state exists: a config that does not fit is
    # refused before a byte of it is allocated.
    compiled = {}
    for phase in schedule.phases:
        if phase_end(schedule, phase, total_steps) > (done or 0):
            compiled[phase.seq_len] = compile_step(
                train_step, abstract, shapes_for(phase),
                name=f"train step at {phase.seq_len} tokens", verbose=is_main,
                device_memory_gb=config.train.device_memory_gb)
    checkpointer = Checkpointer(workdir, keep=config.train.keep_checkpoints)
    latest = checkpointer.latest_step()
    data_state = None
    if latest is not None:
        state, data_state = checkpointer.restore(latest, abstract)
        start_step = latest
        if is_main:
            truncate_after(workdir, latest)
            print(f"resuming from step {latest} of {total_steps} ({checkpointer.directory})",
                  file=sys.stderr)
    else:
        state, shardings = create_train_state(model, optimizer, first_shapes, mesh,
                                              config.train.seed)
        start_step = 0
        if config.init_checkpoint:
            from bertjax.train.init_checkpoint import load_encoder_params

            state = state.replace(params=load_encoder_params(
                config.init_checkpoint, state.params, shardings.params))
    if is_main:
        print(f"model: {config.model.preset} ({param_count(state.params):,} parameters), "
              f"objective {objective.name}, mesh {dict(mesh.shape)}", file=sys.stderr)
    eval_step = make_eval_step(model, mesh, shardings)

    def step_fn(state, local_batch):
        seq_len = local_batch["input_ids"].shape[1]
        return compiled[seq_len](state, partitioning.global_batch(local_batch, mesh))

    batches = data.train_iterator(start_step)
    if data_state:
        batches.set_state(data_state)
    writer = MetricsWriter(workdir, enabled=is_main)
    progress = loop.Progress(start_step, total_steps, enabled=is_main)
    global_batch = config.train.batch_size

    def step_info(step):
        return {"seq_len": schedule.phase_at(step - 1).seq_len}

    logger = LoggingHook(writer, config.train.log_every, summarize=objectives.summarize,
                         step_info=step_info,
                         tokens_in_step=lambda s: global_batch * schedule.phase_at(s - 1).seq_len,
                         progress=progress)
    eval_cache: dict[int, list] = {}

    def evaluate(step, state, _metrics):
        phase = schedule.phase_at(step - 1)
        if phase.seq_len not in eval_cache:
            eval_cache[phase.seq_len] = [partitioning.global_batch(b, mesh) for b in
                                         data.eval_batches(phase, config.train.eval_batches)]
        sums = [eval_step(state.params, b) for b in eval_cache[phase.seq_len]]
        if not sums:
            return
        summary = window_summary(jax.device_get(sums), objectives.summarize)
        writer.write(step, {f"eval_{k}": v for k, v in summary.items()})

    def checkpoint(step, state, _metrics):
        logger.flush()
        checkpointer.save(step, state, batches.get_state())

    hooks = [logger, loop.Every(config.train.checkpoint_every, checkpoint)]
    if config.train.eval_every and config.train.eval_batches and data.has_eval_data:
        hooks.append(loop.Every(config.train.eval_every, evaluate))
    try:
        state, last_step = loop.run(
            state, batches, start_step=start_step, total_steps=total_steps, step_fn=step_fn,
            hooks=hooks, on_stop=lambda step, st: checkpoint(step, st, None), progress=progress)
    finally:
        checkpointer.close()
        batches.close()
        writer.close()
    if is_main:
        if config.train.plot:
            plot_curves(workdir)
        report_outputs(workdir, last_step, total_steps, config.train.plot)
    return logger.last_logged


def phase_end(schedule, phase, total_steps: int) -> int:
    later = [p.start_step for p in schedule.phases if p.start_step > phase.start_step]
    return min(later) if later else total_steps


def abstract_like(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


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
