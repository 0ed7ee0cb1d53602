"""One fine-tuning run's parts (data, model, state, compiled step, evaluator) and its epoch-end
hooks: evaluation, the best checkpoint kept, results.json when it finishes."""

from __future__ import annotations

import functools
import math
import os
import sys
import time

import jax

from bertjax.core import storage
from bertjax.core.atomic_files import write_json
from bertjax.finetune import distillation, evaluation, length_bucketing, readers
from bertjax.finetune.batches import EpochBatches, process_share
from bertjax.finetune.packing import PackedBatches
from bertjax.finetune.schema import abstract_batch
from bertjax.model import adaptation
from bertjax.parallel import partitioning
from bertjax.train import loop, warm_start
from bertjax.train.checkpoint import Checkpointer
from bertjax.train.compilation import compile_step
from bertjax.train.freezing import freeze_encoder, path_name, train_only
from bertjax.train.logging_hook import LoggingHook
from bertjax.train.step_timing import StepTimer
from bertjax.train.metrics_log import MetricsWriter, NonFiniteLossError, truncate_after
from bertjax.train.optimizer import make_optimizer
from bertjax.train.state import StatePlan, param_count
from bertjax.train.step import make_predict_step, make_train_step
from bertjax.jobs import common

RESULTS_FILE = "results.json"


def _parameters(params, trains, trainable: int) -> str:
    """How many parameters the run has and trains (`trainable`: the count when no `trains`
    predicate says it, e.g. a frozen encoder or a soft prompt)."""
    total = param_count(params)
    if trains is None:
        trained = trainable
    else:
        leaves = jax.tree_util.tree_leaves_with_path(params)
        trained = sum(math.prod(p.shape) for path, p in leaves if trains(path_name(path)))
    return f"{total:,} parameters, {trained:,} trained ({100 * trained / total:.2f}%)"


class FinetuneRun:
    def __init__(self, s, start, data, run_dir, seed: int, mesh, fresh: tuple = ()):
        """`run_dir`: the opened RunDirectory (its local files, its checkpoints' location)."""
        workdir = run_dir.path
        self.s, self.data, self.workdir, self.seed, self.mesh = s, data, workdir, seed, mesh
        self.run_dir = run_dir
        self.fresh = fresh  # encoder subtrees initialized, not loaded (see finetune.py)
        self.started = time.perf_counter()
        self.is_main = jax.process_index() == 0
        self.task = data.task
        self.objective = distillation.task_objective(self.task, s.distill)
        index, count = process_share(mesh)
        self.batches = _training_batches(s, data, seed, index, count)
        self.padding = None  # with packing: the padding fractions results.json reports
        self.steps_per_epoch = self.batches.steps_per_epoch
        self.total = s.train.steps or s.train.epochs * self.steps_per_epoch
        self.record = {"best_step": None, "best_metric": None, "best": None, "history": []}
        self.checkpointer = Checkpointer(run_dir.checkpoints, keep=None)
        self.writer = MetricsWriter(workdir, enabled=self.is_main)
        try:
            model, shardings = self._build_state(start)
        except BaseException:
            self.close()
            raise
        eval_rows = s.train.eval_batch_size // count
        self.evaluator = evaluation.Evaluator(
            self.task, make_predict_step(model, mesh, shardings), mesh,
            data.eval_features, data.eval_examples, s.train.eval_batch_size,
            slice(index * eval_rows, (index + 1) * eval_rows),
            s.train.buckets(s.task_settings.max_seq_len))
        self.progress = loop.Progress(self.start_step, self.total, enabled=self.is_main)
        self.logger = LoggingHook(
            self.writer, s.train.log_every, summarize=self.objective.summarize,
            step_info=lambda step: {"epoch": self._epoch(step)},
            timer=StepTimer(lambda step: s.train.batch_size * (
                self.batches.length(step - 1) or s.task_settings.max_seq_len),
                executable_of=lambda step: self.batches.length(step - 1)),  # one a bucket
            progress=self.progress)

    def _epoch(self, step: int) -> float:
        return round(step / self.steps_per_epoch, 4)

    def _build_state(self, start):
        """Restores the newest readable checkpoint, or initializes (loading the encoder)."""
        s = self.s
        model = self.task.model(start.encoder, s.freeze_encoder)
        optimizer, trains = self._optimizer()
        template = (self.batches.template if s.train.packing
                    else self.data.train_features.arrays)
        shapes = abstract_batch(template, s.train.batch_size,
                                partitioning.batch_sharding(self.mesh))
        begun = common.restore_or_init(StatePlan(model, optimizer, shapes, self.mesh, self.seed),
                                       self.checkpointer, self._warm_start(start))
        self._begin(begun)
        self._report_start(trains)
        self.compiled = {}
        if self.total:
            self._prepare_step(model, optimizer, trains, begun, shapes)
        return model, begun.shardings

    def _optimizer(self):
        """The run's optimizer, and `trains`: the predicate of the parameters a method that
        freezes the base model trains (None: what the optimizer's own freezing leaves)."""
        s = self.s
        optimizer = make_optimizer(s.optimizer_config(max(self.total, 1)))
        if s.freeze_encoder or s.method.prompt:  # a soft prompt trains only itself and the head
            optimizer = freeze_encoder(optimizer)
        trains = None
        if s.method.freezes_base:
            trains = functools.partial(adaptation.trains, method=s.method.name, fresh=self.fresh)
            optimizer = train_only(optimizer, trains)
        return optimizer, trains

    def _warm_start(self, start):
        """How a fresh state's parameters load the starting point's encoder (None: there is no
        starting point, the parameters are initialized only)."""
        s = self.s
        if start.source is None or start.source.params is None:
            return None

        def warm(params, shardings):
            params = warm_start.load_encoder(
                s.init_checkpoint, start.source.params, params, shardings,
                s.reinit_top_layers, start.encoder.num_layers,
                trained_pooler=warm_start.pooler_was_trained(
                    start.source.heads, start.source.record.get("initialized", [])),
                heads=("mlm",) if s.method.cloze else (),
                encoders=self.task.encoder_subtrees())
            if s.method.prompt:
                params = warm_start.vocabulary_prompt(params, shardings, start.tokenizer,
                                                      self.seed)
            return params

        return warm

    def _begin(self, begun) -> None:
        """The state begun (restored or initialized): a resumed run's record and metrics log
        taken up at its step, and the count of trainable parameters."""
        s = self.s
        self.state, self.start_step = begun.state, begun.step
        if begun.step:
            self.record.update({k: begun.saved[k] for k in self.record if k in begun.saved})
            if self.is_main:
                truncate_after(self.workdir, begun.step, shown=self.run_dir.location)
                print(f"resuming from step {begun.step} of {self.total}", file=sys.stderr)
        self.trainable = param_count(self.state.params) - (
            param_count(self.state.params["encoder"])
            if s.freeze_encoder or s.method.prompt else 0)

    def _report_start(self, trains) -> None:
        if not self.is_main:
            return
        s, d = self.s, self.data
        readers.report_counts(s.data.train, d.counted["train"])
        readers.report_counts(s.data.eval, d.counted["eval"])
        print(f"{s.task} ({s.method.name}): {len(d.train_examples)} training examples "
              f"({len(d.train_features)} rows), {len(d.eval_examples)} dev; "
              f"{_parameters(self.state.params, trains, self.trainable)}; "
              f"{self.total} steps ({self.steps_per_epoch} per epoch); mesh "
              f"{dict(self.mesh.shape)}", file=sys.stderr)

    def _prepare_step(self, model, optimizer, trains, begun, shapes) -> None:
        """The train step, compiled first for the longest bucket: the step with the largest
        memory, refused before any training if it does not fit."""
        s = self.s
        self._train_step = make_train_step(model, optimizer, self.mesh, begun.shardings,
                                           accumulation_steps=s.train.accumulation_steps,
                                           objective=self.objective, trains=trains)
        self._abstract, self._shapes = begun.abstract, shapes
        if self.is_main and self.batches.buckets:
            bucketed, unbucketed = self.batches.padding()
            print(f"length buckets {'/'.join(map(str, self.batches.buckets))}: "
                  f"{bucketed:.2f} padding tokens per real token ({unbucketed:.2f} all "
                  f"padded to {s.task_settings.max_seq_len}); first epoch's batch lengths "
                  f"{', '.join(map(str, self.batches.lengths_used()))}", file=sys.stderr)
        if s.train.packing:
            self._report_packing()
        self._compiled_for(self.batches.length_bound())

    def _report_packing(self) -> None:
        b, max_len = self.batches, self.s.task_settings.max_seq_len
        self.padding = b.padding(self.s.train.buckets(max_len))
        if self.is_main:
            shown = ", ".join(f"{v:.1%} {k.replace('_', ' ')}" for k, v in self.padding.items())
            print(f"packing: {b.sequences} sequences in {b.rows_per_epoch} rows of {max_len} "
                  f"tokens (up to {b.slots} a row); padding {shown}", file=sys.stderr)

    def _compiled_for(self, length: int | None):
        """The train step compiled for batches cut to `length` tokens (None: uncut), once per
        bucket."""
        if length not in self.compiled:
            shapes = (self._shapes if length is None
                      else length_bucketing.cut_shapes(self._shapes, length))
            name = "fine-tuning train step"
            if self.batches.buckets:
                name += f" for {length} tokens ({len(self.compiled) + 1} of at most " \
                        f"{len(self.batches.buckets)} shapes)"
            self.compiled[length] = compile_step(self._train_step, self._abstract, shapes,
                                                 name=name, verbose=self.is_main)
        return self.compiled[length]

    def _step(self, state, batch):
        length = batch["input_mask"].shape[1] if self.batches.buckets else None
        return self._compiled_for(length)(state, partitioning.global_batch(batch, self.mesh))

    def save(self, step: int, state, metrics=None) -> None:
        """A checkpoint of `step`; only it and the best one are kept."""
        with self.logger.untimed():  # writes the log first; not part of the step time
            self.writer.flush()
            self.run_dir.push()  # a workdir on a bucket: the lines up to the checkpoint, first
            self.checkpointer.save(step, state, {"step": step, **self.record}, metrics=metrics)
            for old in self.checkpointer.all_steps():
                if old not in (step, self.record["best_step"]):
                    self.checkpointer.delete(old)

    def end_of_epoch(self, step: int, state, metrics) -> None:
        with self.logger.untimed():  # evaluation is not part of the step time
            self._evaluate(step, state, metrics)

    def _evaluate(self, step: int, state, metrics) -> None:
        scores = self.evaluator.metrics(state.params)
        entry = {"step": step, "epoch": self._epoch(step), **evaluation.scalars(scores)}
        self.record["history"].append(entry)
        value = scores[self.task.main_metric]
        if evaluation.is_better(self.task.main_metric, value, self.record["best_metric"]):
            self.record.update(best_step=step, best_metric=value, best=scores)
        self.writer.write(step, {"epoch": entry["epoch"], **evaluation.scalars(scores, "eval_")})
        if self.is_main:
            print(f"epoch {entry['epoch']:g} (step {step}): " + ", ".join(
                f"{k} {v:.4f}" for k, v in evaluation.scalars(scores).items()), file=sys.stderr)
        self.save(step, state, metrics)

    def mid_epoch_checkpoint(self, step: int, state, metrics) -> None:
        if step % self.steps_per_epoch:  # epoch ends have their own
            self.save(step, state, metrics)

    def loop(self, stop) -> int:
        if not self.total:  # train.epochs=0: the starting point is evaluated and kept (zero-shot)
            self.end_of_epoch(0, self.state, None)
            self.state = None
            return 0
        hooks = [self.logger, loop.Every(self.steps_per_epoch, self.end_of_epoch)]
        if self.s.train.checkpoint_every:
            hooks.append(loop.Every(self.s.train.checkpoint_every, self.mid_epoch_checkpoint,
                                    at_end=False))
        try:
            _, last_step = loop.run(
                self.state, self.batches.iterate(self.start_step), start_step=self.start_step,
                total_steps=self.total,
                step_fn=self._step,
                hooks=hooks, on_stop=self.save, progress=self.progress, stop_source=stop)
        except NonFiniteLossError as e:
            left = self.checkpointer.set_aside_diverged(e.first_bad_checkpoint)
            raise NonFiniteLossError(f"{e}; {left}", e.first_bad_checkpoint) from None
        self.state = None  # donated to the steps
        return last_step

    def finish(self) -> dict:
        """Writes results.json, then keeps only the best checkpoint (in this order: a crash in
        between leaves a finished run with a spare checkpoint, not one that trains again)."""
        record, task, d = self.record, self.task, self.data
        best_step = record["best_step"] if record["best_step"] is not None else self.total
        results = {
            "finished": True, "task": self.s.task, "method": self.s.method.name,
            "head": task.head, "labels": task.labels, "trained_parameters": self.trainable,
            "main_metric": task.main_metric, "best_metric": record["best_metric"],
            "best_step": best_step, "best_epoch": self._epoch(best_step),
            "eval": record["best"], "history": record["history"], "steps": self.total,
            "steps_per_epoch": self.steps_per_epoch, "seed": self.seed,
            "workdir": self.run_dir.location, "train_examples": len(d.train_examples),
            "train_rows": len(d.train_features), "eval_examples": len(d.eval_examples),
            "counted": d.counted, "init_checkpoint": self.s.init_checkpoint,
            "wall_seconds": round(time.perf_counter() - self.started, 1)}
        if self.padding is not None:
            results["train_padding"] = self.padding
        if self.is_main:
            write_json(os.path.join(self.workdir, RESULTS_FILE), results)
            print(f"best {task.main_metric} {evaluation.shown(record['best_metric'])} at step "
                  f"{best_step}; results: {storage.join(self.run_dir.location, RESULTS_FILE)}",
                  file=sys.stderr)
        for old in self.checkpointer.all_steps():
            if old != best_step:
                self.checkpointer.delete(old)
        return results

    def close(self) -> None:
        self.writer.close()
        self.checkpointer.close()


def _training_batches(s, data, seed: int, index: int, count: int):
    """The run's training batches: packed rows (train.packing) or length-bucketed ones."""
    arrays, max_len = data.train_features.arrays, s.task_settings.max_seq_len
    if s.train.packing:
        return PackedBatches(arrays, s.train.batch_size, seed, max_len, data.task.packed_batch,
                             process_index=index, process_count=count)
    return EpochBatches(arrays, s.train.batch_size, seed, process_index=index,
                        process_count=count, buckets=s.train.buckets(max_len))

