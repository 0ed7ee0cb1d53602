"""Predict mode: the best checkpoint of a finished fine-tuning workdir, applied to a file.

    python -m bertjax.main --config=configs/finetune_X.py --workdir=DIR --config.mode=predict \
        --config.data.predict=PATH [--config.predict_output=OUT]

Writes OUT (default DIR/predictions.jsonl): one JSON object per example, in input order:
classification {"id", "label", "probabilities"}, regression {"id", "score"}, token
classification {"id", "words", "tags"}, span classification {"id", "start", "end", "span",
"label", "probabilities"}; for QA, DIR/predictions.json maps each question id to its
answer text (the official SQuAD evaluation script's input). Labels in PATH are ignored. An
existing OUT is never overwritten. Features and decoding use the trained run's settings (run.json:
labels, CRF, max_seq_len, label_all_subwords, QA windows, soft prompt, cloze template and
verbalizer), not the config's.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import jax

from bertjax.inference import loading
from bertjax.inference.prediction import predict_examples, trained_settings
from bertjax.core.atomic_files import write_text
from bertjax.core.errors import UserError
from bertjax.finetune import readers
from bertjax.finetune.examples import SpanExample, TaggedExample, TextExample
from bertjax.finetune.tasks import task_class
from bertjax.settings.finetune import FinetuneSettings


def _unlabeled(example):
    if isinstance(example, (TextExample, SpanExample)):
        return dataclasses.replace(example, label=None)
    if isinstance(example, TaggedExample):
        return dataclasses.replace(example, tags=None)
    return example  # QA answers are not read outside training


def _source_run(workdir: str, task: str) -> tuple[loading.Loaded, int | None, str]:
    """The trained run (its best restart), the step to use (None: its latest) and a note to
    print once every check has passed (empty when there is none)."""
    results = loading.read_json(os.path.join(workdir, loading.RESULTS_FILE))
    recorded = os.path.isfile(os.path.join(workdir, loading.RUN_RECORD)) or results
    run = loading.describe(workdir) if recorded else None
    record = run.record if run is not None else {}
    if not str(record.get("task", "")).startswith("finetune"):
        raise UserError(f"{workdir} holds no fine-tuning run (no run.json of a finetune task); "
                        "train first with --config.mode=train")
    if record["task"] != task:
        raise UserError(f"{workdir} holds a {record['task']} run, the config says {task}")
    if not results.get("finished"):
        return run, None, (f"note: the run in {workdir} has not finished; predicting with its "
                           "latest checkpoint")
    return run, results.get("best_step"), ""


def _output_path(s: FinetuneSettings, workdir: str, qa: bool) -> str:
    path = s.predict_output or os.path.join(workdir,
                                            "predictions.json" if qa else "predictions.jsonl")
    if os.path.exists(path):
        raise UserError(f"{path} exists; choose another --config.predict_output or remove it")
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        raise UserError(f"the directory of {path} does not exist")
    return path


def run(s: FinetuneSettings, workdir: str) -> dict:
    cls = task_class(s.task)
    trained, step, note = _source_run(workdir, s.task)
    task_settings = trained_settings(s.task_settings, trained.record)
    output = _output_path(s, workdir, qa=cls.kind == "qa")
    source = s.data.source(s.data.predict, labeled=False, regression=cls.regression)
    examples = [_unlabeled(e) for e in readers.read(source, cls.kind)]
    loaded = loading.load(trained.path, step)
    predictions = predict_examples(loaded, task_settings, examples, s.data.predict,
                                   s.mesh.make(), s.train.eval_batch_size, note=note,
                                   buckets=s.train.buckets(task_settings.max_seq_len))
    if jax.process_index() == 0:
        write_text(output, _serialized(predictions))
        print(f"wrote {len(examples)} predictions to {output} (checkpoint step "
              f"{loaded.step} of {loaded.path})", file=sys.stderr)
    return {"predictions": output, "count": len(examples), "step": loaded.step}


def _serialized(predictions) -> str:
    if isinstance(predictions, dict):
        return json.dumps(predictions, indent=1, ensure_ascii=False)
    return "".join(json.dumps(p, ensure_ascii=False) + "\n" for p in predictions)
