"""A fine-tuned run's predictions for examples, with the settings it was trained with: what predict
mode (`bertjax.jobs.predict`) and `bertjax.load(...).predict` both run."""

from __future__ import annotations

import dataclasses
import sys

import jax
import optax

from bertjax.core import length_buckets
from bertjax.finetune import evaluation, readers
from bertjax.finetune.batches import process_share
from bertjax.finetune.schema import abstract_batch
from bertjax.finetune.tasks import TaskSettings, make_task
from bertjax.finetune.tasks.base import RECORDED_SETTINGS
from bertjax.inference import loading
from bertjax.train.state import abstract_train_state
from bertjax.train.step import make_predict_step


def trained_settings(current: TaskSettings, record: dict) -> TaskSettings:
    """The task settings the run in `record` (run.json) was trained with: its labels and CRF, and
    its recorded feature and decoding settings; the config's where an older record lacks them."""
    heads = record.get("heads") or {}
    recorded = record.get("task_settings") or {}
    if "max_seq_len" in record:  # recorded before task_settings were
        recorded = {"max_seq_len": record["max_seq_len"], **recorded}
    return dataclasses.replace(
        current, crf=bool(heads.get("crf")), labels=tuple(heads.get("labels") or ()),
        **{name: recorded[name] for name in RECORDED_SETTINGS if name in recorded})


def predict_examples(loaded: loading.Loaded, task_settings: TaskSettings, examples: list,
                     where: str, mesh, batch_size: int, *, report: bool = True,
                     note: str = "", buckets: tuple[int, ...] | None = None):
    """A fine-tuned model's predictions for `examples` (the task's own format: a list, or for QA
    a dict of answers), with the task settings it was trained with. `report`: print the
    featurization's counts (skipped, truncated); `note`: a line printed once the features are
    built (past every refusal). `buckets`: the lengths batches are cut to (default: multiples
    of length_buckets.DEFAULT_MULTIPLE)."""
    if buckets is None:
        buckets = length_buckets.bucket_lengths(length_buckets.DEFAULT_MULTIPLE,
                                                task_settings.max_seq_len)
    tokenizer = loaded.tokenizer()
    task = make_task(loaded.record["task"], task_settings, list(task_settings.labels), tokenizer)
    features = task.featurize(tokenizer, examples, where, training=False)
    # Only now, past the refusals: a refused command prints one line.
    if note:
        print(note, file=sys.stderr)
    if report:
        readers.report_counts(where, features.counts)
    model = task.model(loaded.require_encoder(), False)
    _, shardings = abstract_train_state(model, optax.identity(),
                                        abstract_batch(features.arrays, batch_size), mesh)
    params = jax.device_put(loaded.params, shardings.params)
    index, count = process_share(mesh)
    local = slice(index * batch_size // count, (index + 1) * batch_size // count)
    evaluator = evaluation.Evaluator(task, make_predict_step(model, mesh, shardings), mesh,
                                     features, examples, batch_size, local, buckets)
    return task.predict(examples, features, evaluator.outputs(params))
