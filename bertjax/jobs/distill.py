"""The teacher side of a distillation run (`configs/distill.py`, `distill.teacher=RUN`).

    teacher   a fine-tuned run (a workdir, used at its best checkpoint, or its params export) of
              the student's task, with the student's labels and vocabulary (all refused otherwise)
    student   distill.student_layers=K: the teacher's embeddings, first K layers and pooler (a
              fresh head; DistilBERT's initialisation from the teacher's own layers); else what
              init_checkpoint or model.preset give, on the teacher's vocabulary by default
    logits    the teacher's, for every training row, computed once here (deterministic forward,
              so the same at every epoch) and handed to the trainer as the feature array
              `teacher_logits`; the step then needs neither the teacher nor its parameters

Everything else is the ordinary fine-tuning run (bertjax.jobs.finetune) with the distilled
objective (bertjax.finetune.distillation); the student is a fine-tuned run like any other.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
import time

import jax
import numpy as np
import optax

from bertjax.core.errors import UserError
from bertjax.finetune import features as feats
from bertjax.finetune.batches import process_share
from bertjax.finetune.distillation import with_teacher_logits
from bertjax.finetune.schema import abstract_batch
from bertjax.inference import loading
from bertjax.jobs import finetune
from bertjax.jobs.starting_point import StartingPoint, starting_point
from bertjax.jobs.task_data import TaskData, read_task_data
from bertjax.model import layout
from bertjax.parallel import partitioning
from bertjax.settings.finetune import FinetuneSettings
from bertjax.train.state import abstract_train_state, param_count
from bertjax.train.step import make_predict_step

_LAYER = re.compile(r"layer_(\d+)$")


def run(s: FinetuneSettings, workdir: str) -> dict:
    """Fine-tunes the student (mode=train with a distill block) on the teacher's logits."""
    s, start, data = prepare(s, finetune.starts_fresh(s, workdir))
    return finetune.train_runs(s, start, data, workdir)


def load_teacher(path: str, task: str) -> loading.Loaded:
    """The teacher's parameters (a finished workdir's best checkpoint); refuses anything that is
    not a fine-tuned run of `task` without a CRF."""
    described = loading.describe(path)
    recorded = str(described.record.get("task", ""))
    if not recorded.startswith("finetune"):
        raise UserError(f"distill.teacher {path} is not a fine-tuned run (its task is "
                        f"{recorded or 'not recorded'}); fine-tune the teacher first")
    if recorded != task:
        raise UserError(f"distill.teacher {path} is a {recorded} run, the student's task is "
                        f"{task}")
    if described.heads.get("crf"):
        raise UserError(f"distill.teacher {path} is a CRF tagger; distillation reads per-token "
                        "distributions, which a CRF's emissions are not")
    step = None
    if described.kind == loading.WORKDIR:
        results = loading.read_json(os.path.join(path, loading.RESULTS_FILE))
        if results.get("finished"):
            step = results.get("best_step")
        elif jax.process_index() == 0:
            print(f"note: the teacher run {path} has not finished; using its latest checkpoint",
                  file=sys.stderr)
    return loading.load(path, step)


def first_layers(teacher: loading.Loaded, k: int) -> loading.Loaded:
    """The teacher cut to its embeddings, first `k` layers and pooler (heads dropped)."""
    encoder = teacher.require_encoder()
    if k > encoder.num_layers:
        raise UserError(f"distill.student_layers={k} exceeds the teacher's {encoder.num_layers} "
                        "layers")
    kept = {name: value for name, value
            in layout.to_unscanned(teacher.params["encoder"]).items()
            if not _LAYER.match(name) or int(_LAYER.match(name).group(1)) < k}
    return dataclasses.replace(teacher, encoder=encoder.replace(num_layers=k),
                               params={"encoder": kept})


def _check_vocabulary(student, teacher, teacher_path: str) -> None:
    """Teacher and student read the same feature rows, so they must share token ids."""
    def tokens(tokenizer):
        return [tokenizer.id_to_token(i) for i in range(tokenizer.vocab_size)]

    if tokens(student) != tokens(teacher):
        raise UserError(f"the student's vocabulary ({student.vocab_size} tokens) is not the "
                        f"vocabulary of distill.teacher {teacher_path} ({teacher.vocab_size} "
                        "tokens); both read the same token ids (leave data.tokenizer empty)")


def student_start(s: FinetuneSettings, teacher: loading.Loaded, *, with_params: bool
                  ) -> tuple[FinetuneSettings, StartingPoint]:
    """(settings, starting point) of the student: init_checkpoint names the teacher when the
    student is its first layers (what run.json and the warm-start message then say)."""
    k = s.distill.student_layers
    if k:
        s = dataclasses.replace(s, init_checkpoint=teacher.path)
        return s, starting_point(s, with_params=with_params, source=first_layers(teacher, k))
    if not s.data.tokenizer and not s.init_checkpoint:
        if not teacher.tokenizer_dir:
            raise UserError(f"distill.teacher {teacher.path} keeps no tokenizer; set "
                            "data.tokenizer to its vocabulary")
        s = dataclasses.replace(s, data=dataclasses.replace(s.data,
                                                            tokenizer=teacher.tokenizer_dir))
    return s, starting_point(s, with_params=with_params)


def teacher_logits(teacher: loading.Loaded, data: TaskData, mesh, batch_size: int) -> np.ndarray:
    """The teacher head's logits for every training row, fp32, in row order."""
    model = data.task.model(teacher.require_encoder(), False)
    arrays = data.train_features.arrays
    _, shardings = abstract_train_state(model, optax.identity(), abstract_batch(arrays, batch_size),
                                        mesh)
    params = jax.device_put(teacher.params, shardings.params)
    predict = make_predict_step(model, mesh, shardings)
    index, count = process_share(mesh)
    local = slice(index * batch_size // count, (index + 1) * batch_size // count)
    collected = []
    for batch in feats.batches(arrays, batch_size):
        placed = partitioning.global_batch({k: v[local] for k, v in batch.items()}, mesh)
        collected.append(jax.device_get(predict(params, placed)["logits"]))
    return np.concatenate(collected)[:len(data.train_features)].astype(np.float32)


def prepare(s: FinetuneSettings, fresh: bool
            ) -> tuple[FinetuneSettings, StartingPoint, TaskData]:
    """The student's settings, starting point and data, the training rows carrying the
    teacher's logits. Every refusal comes before anything is written."""
    teacher = load_teacher(s.distill.teacher, s.task)
    s, start = student_start(s, teacher, with_params=fresh)
    _check_vocabulary(start.tokenizer, teacher.tokenizer(), s.distill.teacher)
    data = read_task_data(s, start.tokenizer)
    labels = list(teacher.heads.get("labels") or ())
    if labels != data.task.labels:
        raise UserError(f"the labels of distill.teacher {s.distill.teacher} ({', '.join(labels)}) "
                        f"differ from the student's ({', '.join(data.task.labels)}); set "
                        "data.labels to the teacher's")
    limit = teacher.require_encoder().max_sequence_length
    if s.task_settings.max_seq_len > limit:
        raise UserError(f"data.max_seq_len {s.task_settings.max_seq_len} exceeds the teacher's "
                        f"{limit} positions")
    began = time.perf_counter()
    logits = teacher_logits(teacher, data, s.mesh.make(), s.train.eval_batch_size)
    data.train_features.arrays = with_teacher_logits(data.task, data.train_features.arrays, logits)
    if jax.process_index() == 0:
        print(f"distill: teacher {teacher.path} (step {teacher.step}, "
              f"{teacher.require_encoder().num_layers} layers, "
              f"{param_count(teacher.params):,} parameters): logits of {len(logits)} training "
              f"rows in {time.perf_counter() - began:.1f} s; alpha {s.distill.alpha}, "
              f"temperature {s.distill.temperature}", file=sys.stderr)
    return s, start, data
