"""Tiny fine-tuning runs for the tests: `python -m bertjax.main` in this process on a tiny model that
starts from scratch, and the results.json it leaves."""

import json
import os

from bertjax.cli import main
import run_devices

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Fast-learning settings for a from-scratch tiny model (not the fine-tuning defaults).
TINY = {"model.preset": "tiny", "model.hidden_dropout": 0.0, "model.attention_dropout": 0.0,
        "optimizer.learning_rate": 2e-3, "train.batch_size": 32, "train.log_every": 10,
        "train.bucket_multiple": 0, **run_devices.IN_A_WORKER}

# The movie-review sentiment run of test_finetune (also test_distill's teacher). Logged every
# step: a resumed run then logs exactly what an uninterrupted one does (a window of steps
# straddling the crash would average fewer steps).
SENTIMENT = {"data.max_train_examples": 2000, "data.max_eval_examples": 400,
             "data.max_seq_len": 40, "train.epochs": 2, "train.log_every": 1}


# A model trained from scratch is the tiny preset (2 layers) narrowed to 64 wide with a 256-wide
# feed-forward: the runs' steps are most of a learning test's time, and these tasks do not need the
# width: narrowed, they learn about as well as at 128 wide, each well clear of its test's
# threshold, for much less CPU. A run that starts from a checkpoint has its size.
NARROW = {"model.hidden_size": 64, "model.intermediate_size": 256}


def finetune(config: str, workdir: str, **settings) -> int:
    argv = ["bertjax.cli.main", f"--config={REPO}/configs/{config}.py", f"--workdir={workdir}"]
    settings = {**TINY, **settings}
    if settings["model.preset"] == "tiny":
        settings = {**NARROW, **settings}
    return main.main(argv + [f"--config.{k}={v}" for k, v in settings.items()])


def results(workdir: str) -> dict:
    with open(os.path.join(workdir, "results.json")) as f:
        return json.load(f)
