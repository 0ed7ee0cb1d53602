"""Which job a config names, in one table: pretraining, or fine-tuning in one of its modes.

    PretrainSettings                          pretrain   (bertjax.jobs.pretrain)
    FinetuneSettings, mode=train              train      (bertjax.jobs.finetune)
    FinetuneSettings, mode=train + distill    distill    (bertjax.jobs.distill: a student of a
                                                         teacher run, then the same training)
    FinetuneSettings, mode=predict            predict    (bertjax.jobs.predict)
"""

from __future__ import annotations

from typing import Callable

from bertjax.jobs import distill, finetune, predict, pretrain
from bertjax.settings import Settings
from bertjax.settings.finetune import FinetuneSettings
from bertjax.settings.pretrain import PretrainSettings

JOBS: dict[str, Callable[..., dict]] = {
    "pretrain": pretrain.run,
    "train": finetune.run,
    "distill": distill.run,
    "predict": predict.run,
}


def job_name(s: Settings) -> str:
    if isinstance(s, PretrainSettings):
        return "pretrain"
    if isinstance(s, FinetuneSettings) and s.mode == "train" and s.distill is not None:
        return "distill"
    return s.mode


def run(s: Settings, workdir: str) -> dict:
    """Runs (or resumes) the job the settings name in `workdir`; returns its result (pretraining:
    the last logged metrics; fine-tuning: results.json's content; predict: where it wrote)."""
    return JOBS[job_name(s)](s, workdir)
