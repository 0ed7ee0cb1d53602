"""Distillation's settings: the config's `distill` section, whose presence makes a fine-tuning run
the student of a teacher (configs/distill.py), checked against the task and the student's start."""

from __future__ import annotations

from bertjax.core.errors import UserError
from bertjax.finetune.distillation import TASKS, DistillSettings
from bertjax.settings.config_keys import Section


def read(config: Section, *, crf: bool, require_teacher: bool, init_checkpoint: str,
         from_checkpoint: bool) -> DistillSettings | None:
    """None without a `distill` section; else its settings, checked against config.task and
    against where the student starts (the teacher's first K layers, or init_checkpoint /
    model.preset)."""
    if "distill" not in config:
        return None
    section, task = config.distill, config.task
    s = DistillSettings(str(section.teacher).strip(), float(section.alpha),
                        float(section.temperature), int(section.student_layers))
    if task not in TASKS:
        raise UserError(f"distillation supports {', '.join(TASKS)}, not {task}")
    if crf:
        raise UserError("distillation reads per-token distributions; a CRF tagger's are not "
                        "(set finetune.crf=false)")
    if s.student_layers and init_checkpoint:
        raise UserError(f"distill.student_layers={s.student_layers} starts the student from the "
                        "teacher's layers; leave config.init_checkpoint empty (or set "
                        "distill.student_layers=0 to start from it)")
    if s.student_layers and not from_checkpoint:
        raise UserError(f"distill.student_layers={s.student_layers} takes the student's shape "
                        "from the teacher; leave model.preset=from_checkpoint (or set "
                        "distill.student_layers=0 for a model.preset student)")
    if not (s.student_layers or init_checkpoint or not from_checkpoint):
        raise UserError("choose the student: distill.student_layers=K (the teacher's first K "
                        "layers), a model.preset (trained from scratch on the teacher's "
                        "vocabulary) or config.init_checkpoint")
    if require_teacher and not s.teacher:
        raise UserError("distillation needs the teacher: --config.distill.teacher=WORKDIR (a "
                        "fine-tuned run)")
    return s
