"""The fine-tuning job: `python -m bertjax.main --config=configs/finetune_X.py --workdir=DIR`.

config -> starting point (encoder shape, tokenizer) -> examples -> features -> sharded state
(encoder loaded, head fresh) -> the same compiled, donated train step as pretraining (with the
task's objective) -> evaluation and a checkpoint at every epoch end.

The workdir keeps two checkpoints while training, the latest (to resume: the same command again
continues exactly, batch order included) and the best on the dev set; when the run finishes, only
the best is left, so it is also the workdir's latest (what `bertjax.export` takes by default).

    DIR/metrics.jsonl   step, loss, learning_rate, tokens_per_sec ...; eval_* at epoch ends
    DIR/results.json    main metric, best_step (its checkpoint is kept), per-epoch history
    DIR/run.json        task, encoder config, tokenizer_dir, heads (what export reads)
    DIR/tokenizer/      the vocabulary

`train.restarts=N` runs N seeds in DIR/restart_K (small datasets are unstable) and DIR/results.json
names the best one (`best_workdir`).
"""

from __future__ import annotations

import dataclasses
import os
import sys
import time

import jax
import ml_collections

from bertjax import builders
from bertjax.errors import UserError
from bertjax.finetune import evaluation, preparation
from bertjax.finetune import settings as settings_lib
from bertjax.finetune import starting_point as start_lib
from bertjax.finetune.batches import EpochBatches, process_share
from bertjax.parallel import partitioning
from bertjax.train import loop
from bertjax.train.checkpoint import Checkpointer
from bertjax.train.compilation import compile_step
from bertjax.train.logging_hook import LoggingHook
from bertjax.train.metrics import MetricsWriter, truncate_after
from bertjax.train.optimizer import make_optimizer
from bertjax.train.state import abstract_train_state, create_train_state, param_count
from bertjax.train.step import make_predict_step, make_train_step
from bertjax.train.workdir import check_run_record, ensure_writable

RESULTS_FILE = "results.json"
_LAYOUT_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                  "max_position_embeddings", "type_vocab_size", "param_dtype", "scan_layers")


def validate(config: ml_collections.ConfigDict) -> settings_lib.Settings:
    """Checks a fine-tuning config without reading data or checkpoints (tests/test_configs)."""
    s = settings_lib.settings(config, require_data=False)
    s.optimizer_config(max(s.train.steps, 1000))
    return s


def run(config: ml_collections.ConfigDict, workdir: str) -> dict:
    s = settings_lib.settings(config)
    if s.mode == "predict":
        from bertjax.finetune import predict

        return predict.run(config, s, workdir)
    prepared = preparation.prepare(config, s)
    if s.train.restarts == 1:
        return train(config, s, prepared, workdir, s.train.seed)
    return train_restarts(config, s, prepared, workdir)


def shown(metric: float | None) -> str:
    """A metric for a log line; None (no evaluation gave a number) is n/a."""
    return "n/a" if metric is None else f"{metric:.4f}"


def batch_shapes(arrays: dict, batch_size: int, sharding) -> dict[str, jax.ShapeDtypeStruct]:
    return {key: jax.ShapeDtypeStruct((batch_size, *value.shape[1:]), value.dtype,
                                      sharding=sharding) for key, value in arrays.items()}


def abstract_like(tree):
    return jax.tree.map(lambda x: jax.ShapeDtypeStruct(x.shape, x.dtype, sharding=x.sharding), tree)


def _check_batch_sizes(s: settings_lib.Settings, mesh) -> None:
    shards = partitioning.batch_shards(mesh)
    for name in ("batch_size", "eval_batch_size"):
        size = getattr(s.train, name)
        per_step = size // s.train.accumulation_steps if name == "batch_size" else size
        if per_step % shards:
            raise UserError(f"train.{name} {size} must split into multiples of the {shards} "
                            "data x fsdp shards of the mesh")


def _record_run(workdir: str, config, s, prepared: preparation.Prepared, seed: int) -> None:
    encoder = prepared.start.encoder
    layout = {k: v for k, v in dataclasses.asdict(encoder).items() if k in _LAYOUT_FIELDS}
    tokenizer_dir = start_lib.save_tokenizer(prepared.start.tokenizer, workdir)
    task = prepared.task
    check_run_record(
        workdir, {"task": s.task, "model": layout, "heads": task.heads_info()},
        info={"encoder": dataclasses.asdict(encoder), "tokenizer_dir": tokenizer_dir,
              "init_checkpoint": os.path.abspath(s.init_checkpoint) if s.init_checkpoint else "",
              "seed": seed, "max_seq_len": s.task_settings.max_seq_len,
              "task_settings": task.recorded_settings()})


def train(config: ml_collections.ConfigDict, s: settings_lib.Settings,
          prepared: preparation.Prepared, workdir: str, seed: int) -> dict:
    """One fine-tuning run (resumed if the workdir holds one); returns its results."""
    started = time.perf_counter()
    mesh = builders.mesh(config)
    _check_batch_sizes(s, mesh)
    workdir = ensure_writable(workdir)
    done = evaluation.read_json(os.path.join(workdir, RESULTS_FILE))
    if done and done.get("finished"):
        print(f"nothing to do: the run in {workdir} has finished ({RESULTS_FILE})",
              file=sys.stderr)
        return done
    if jax.process_index() == 0:
        _record_run(workdir, config, s, prepared, seed)
    run = _Run(s, prepared, workdir, seed, mesh)
    try:
        last_step = run.loop()
        run.checkpointer.wait()
        if last_step < run.total:
            return {"finished": False, "step": last_step}
        return run.finish(time.perf_counter() - started)
    finally:
        run.close()


class _Run:
    """A run's parts (data, model, state, compiled step, evaluator) and its epoch-end hooks."""

    def __init__(self, s: settings_lib.Settings, prepared: preparation.Prepared, workdir: str,
                 seed: int, mesh):
        self.s, self.prepared, self.workdir, self.seed, self.mesh = s, prepared, workdir, seed, mesh
        self.is_main = jax.process_index() == 0
        self.task = prepared.task
        index, count = process_share(mesh)
        self.batches = EpochBatches(prepared.train_features.arrays, s.train.batch_size, seed,
                                    process_index=index, process_count=count)
        self.steps_per_epoch = self.batches.steps_per_epoch
        self.total = s.train.steps or s.train.epochs * self.steps_per_epoch
        self.record = {"best_step": None, "best_metric": None, "best": None, "history": []}
        self.checkpointer = Checkpointer(workdir, keep=None)
        self.writer = MetricsWriter(workdir, enabled=self.is_main)
        try:
            model, shardings = self._build_state()
        except BaseException:
            self.close()
            raise
        eval_rows = s.train.eval_batch_size // count
        self.evaluator = evaluation.Evaluator(
            self.task, make_predict_step(model, mesh, shardings), mesh,
            prepared.eval_features, prepared.eval_examples, s.train.eval_batch_size,
            slice(index * eval_rows, (index + 1) * eval_rows))
        self.progress = loop.Progress(self.start_step, self.total, enabled=self.is_main)
        self.logger = LoggingHook(
            self.writer, s.train.log_every, summarize=self.task.objective.summarize,
            step_info=lambda step: {"epoch": self._epoch(step)},
            tokens_in_step=lambda _: s.train.batch_size * s.task_settings.max_seq_len,
            progress=self.progress)

    def _epoch(self, step: int) -> float:
        return round(step / self.steps_per_epoch, 4)

    def _build_state(self):
        """Restores the workdir's latest checkpoint, or initializes (loading the encoder)."""
        s, mesh, encoder = self.s, self.mesh, self.prepared.start.encoder
        model = self.task.model(encoder, s.freeze_encoder)
        optimizer = make_optimizer(s.optimizer_config(self.total))
        if s.freeze_encoder:
            optimizer = start_lib.freeze_encoder(optimizer)
        shapes = batch_shapes(self.prepared.train_features.arrays, s.train.batch_size,
                              partitioning.batch_sharding(mesh))
        latest = self.checkpointer.latest_step()
        if latest is not None:
            abstract, shardings = abstract_train_state(model, optimizer, shapes, mesh, self.seed)
            self.state, saved = self.checkpointer.restore(latest, abstract)
            self.record.update({k: saved[k] for k in self.record if k in saved})
            if self.is_main:
                truncate_after(self.workdir, latest)
                print(f"resuming from step {latest} of {self.total}", file=sys.stderr)
        else:
            self.state, shardings = create_train_state(model, optimizer, shapes, mesh, self.seed)
            if s.init_checkpoint:
                self.state = self.state.replace(params=start_lib.load_encoder(
                    s.init_checkpoint, self.state.params, shardings.params,
                    s.reinit_top_layers, encoder.num_layers))
        self.start_step = latest or 0
        if self.is_main:
            p = self.prepared
            print(f"{s.task}: {len(p.train_examples)} training examples "
                  f"({len(p.train_features)} rows), {len(p.eval_examples)} dev; "
                  f"{param_count(self.state.params):,} parameters; {self.total} steps "
                  f"({self.steps_per_epoch} per epoch); mesh {dict(mesh.shape)}",
                  file=sys.stderr)
        step = make_train_step(model, optimizer, mesh, shardings,
                               accumulation_steps=s.train.accumulation_steps,
                               objective=self.task.objective)
        self.compiled = compile_step(step, abstract_like(self.state), shapes,
                                     name="fine-tuning train step", verbose=self.is_main)
        return model, shardings

    def save(self, step: int, state) -> None:
        """A checkpoint of `step`; only it and the best one are kept."""
        self.logger.flush()
        self.checkpointer.save(step, state, {"step": step, **self.record})
        for old in self.checkpointer.all_steps():
            if old not in (step, self.record["best_step"]):
                self.checkpointer.delete(old)

    def end_of_epoch(self, step: int, state, _metrics) -> None:
        self.logger.flush()
        metrics = self.evaluator.metrics(state.params)
        entry = {"step": step, "epoch": self._epoch(step), **evaluation.scalars(metrics)}
        self.record["history"].append(entry)
        value = metrics[self.task.main_metric]
        if evaluation.is_better(self.task.main_metric, value, self.record["best_metric"]):
            self.record.update(best_step=step, best_metric=value, best=metrics)
        self.writer.write(step, {"epoch": entry["epoch"], **evaluation.scalars(metrics, "eval_")})
        if self.is_main:
            print(f"epoch {entry['epoch']:g} (step {step}): " + ", ".join(
                f"{k} {v:.4f}" for k, v in evaluation.scalars(metrics).items()), file=sys.stderr)
        self.save(step, state)

    def mid_epoch_checkpoint(self, step: int, state, _metrics) -> None:
        if step % self.steps_per_epoch:  # epoch ends have their own
            self.save(step, state)

    def loop(self) -> int:
        hooks = [self.logger, loop.Every(self.steps_per_epoch, self.end_of_epoch)]
        if self.s.train.checkpoint_every:
            hooks.append(loop.Every(self.s.train.checkpoint_every, self.mid_epoch_checkpoint,
                                    at_end=False))
        _, last_step = loop.run(
            self.state, self.batches.iterate(self.start_step), start_step=self.start_step,
            total_steps=self.total,
            step_fn=lambda st, b: self.compiled(st, partitioning.global_batch(b, self.mesh)),
            hooks=hooks, on_stop=self.save, progress=self.progress)
        self.state = None  # donated to the steps
        return last_step

    def finish(self, seconds: float) -> dict:
        """Writes results.json, then keeps only the best checkpoint (in this order: a crash in
        between leaves a finished run with a spare checkpoint, not one that trains again)."""
        record, task, p = self.record, self.task, self.prepared
        best_step = record["best_step"] if record["best_step"] is not None else self.total
        results = {
            "finished": True, "task": self.s.task, "head": task.head, "labels": task.labels,
            "main_metric": task.main_metric, "best_metric": record["best_metric"],
            "best_step": best_step, "best_epoch": self._epoch(best_step),
            "eval": record["best"], "history": record["history"], "steps": self.total,
            "steps_per_epoch": self.steps_per_epoch, "seed": self.seed,
            "workdir": self.workdir, "train_examples": len(p.train_examples),
            "train_rows": len(p.train_features), "eval_examples": len(p.eval_examples),
            "counted": p.counted, "init_checkpoint": self.s.init_checkpoint,
            "wall_seconds": round(seconds, 1)}
        if self.is_main:
            evaluation.write_json(os.path.join(self.workdir, RESULTS_FILE), results)  # atomic
            print(f"best {task.main_metric} {shown(record['best_metric'])} at step {best_step}; "
                  f"results: {os.path.join(self.workdir, RESULTS_FILE)}", file=sys.stderr)
        for old in self.checkpointer.all_steps():
            if old != best_step:
                self.checkpointer.delete(old)
        return results

    def close(self) -> None:
        self.writer.close()
        self.checkpointer.close()


def train_restarts(config: ml_collections.ConfigDict, s: settings_lib.Settings,
                   prepared: preparation.Prepared, workdir: str) -> dict:
    """N runs with seeds seed .. seed + N - 1; the best by the main metric is named."""
    workdir = ensure_writable(workdir)
    runs = []
    for k in range(s.train.restarts):
        if jax.process_index() == 0:
            print(f"restart {k + 1} of {s.train.restarts}", file=sys.stderr)
        result = train(config, s, prepared, os.path.join(workdir, f"restart_{k}"),
                       s.train.seed + k)
        if not result.get("finished"):
            return result  # stopped (SIGTERM): the same command resumes this restart
        runs.append(result)
    metric = prepared.task.main_metric
    best = 0
    for k, result in enumerate(runs):
        if evaluation.is_better(metric, result["best_metric"], runs[best]["best_metric"]):
            best = k
    summary = {**runs[best], "best_restart": best, "best_workdir": runs[best]["workdir"],
               "workdir": workdir,
               "restarts": [{"seed": r["seed"], "best_metric": r["best_metric"],
                             "best_step": r["best_step"], "workdir": r["workdir"]} for r in runs]}
    if jax.process_index() == 0:
        evaluation.write_json(os.path.join(workdir, RESULTS_FILE), summary)
        print(f"best of {len(runs)} restarts: restart_{best} ({metric} "
              f"{shown(runs[best]['best_metric'])})", file=sys.stderr)
    return summary
