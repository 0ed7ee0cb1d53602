"""The fine-tuning job: `python -m bertjax.main --config=configs/finetune_X.py --workdir=DIR`.

settings -> starting point (encoder, tokenizer, parameters of init_checkpoint) -> examples and
features -> sharded state (encoder loaded, head fresh) -> the same compiled, donated train step
as pretraining (with the task's objective) -> evaluation and a checkpoint at every epoch end.

The workdir keeps two checkpoints while training, the latest (to resume: the same command again
continues exactly, batch order included) and the best on the dev set; when the run finishes, only
the best is left, so it is also the workdir's latest (what `bertjax.cli.export` takes by default).

    DIR/metrics.jsonl   step, loss, learning_rate, tokens_per_sec ...; eval_* at epoch ends
    DIR/results.json    main metric, best_step (its checkpoint is kept), per-epoch history
    DIR/run.json        task, encoder config, tokenizer_dir, heads (what export reads)
    DIR/tokenizer/      the vocabulary

`train.restarts=N` runs N seeds in DIR/restart_K (small datasets are unstable) and DIR/results.json
names the best one (`best_workdir`).
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import jax

from bertjax.core import storage
from bertjax.core.atomic_files import write_json
from bertjax.core.errors import UserError
from bertjax.data.tokenizer import Tokenizer
from bertjax.finetune import evaluation
from bertjax.inference import loading
from bertjax.interop.hf_roberta import HEADS_KEY
from bertjax.jobs import common
from bertjax.jobs.finetune_run import FinetuneRun
from bertjax.jobs.run_directory import RunDirectory
from bertjax.jobs.starting_point import StartingPoint, starting_point
from bertjax.jobs.task_data import TaskData, read_task_data
from bertjax.settings.finetune import FinetuneSettings
from bertjax.settings.shared import layout_of
from bertjax.train import warm_start

RESULTS_FILE = loading.RESULTS_FILE


def run(s: FinetuneSettings, workdir: str) -> dict:
    """Fine-tunes from the init checkpoint (mode=train without a distill block)."""
    fresh = starts_fresh(s, workdir)
    start = starting_point(s, with_params=fresh)
    if s.method.cloze and fresh:
        _check_mlm_head(s, start.source)
    return train_runs(s, start, read_task_data(s, start.tokenizer), workdir)


def starts_fresh(s: FinetuneSettings, workdir: str) -> bool:
    """Whether some run (of the restarts) has no checkpoint yet, so needs the init parameters."""
    workdirs = ([workdir] if s.train.restarts == 1 else  # lazily: stops at the first fresh one
                (os.path.join(workdir, f"restart_{k}") for k in range(s.train.restarts)))
    return any(not loading.checkpoint_steps(w) for w in workdirs)


def train_runs(s: FinetuneSettings, start: StartingPoint, data: TaskData, workdir: str) -> dict:
    """The run, or its restarts, with stop requests (SIGTERM) caught from here on."""
    with common.stop_requests() as stop:
        if s.train.restarts == 1:
            return train(s, start, data, workdir, s.train.seed, stop)
        return train_restarts(s, start, data, workdir, stop)


def _check_mlm_head(s: FinetuneSettings, source: loading.Loaded | None) -> None:
    """Cloze scores with the init checkpoint's MLM head: refused without one, and said when it
    was never pretrained (an import of an encoder-only model fills it in fresh)."""
    if source is None or "mlm" not in (source.params or {}):
        raise UserError(f"finetune.method={s.method.name} with a verbalizer scores labels with the "
                        f"pretrained MLM head, and {s.init_checkpoint or 'a model from scratch'} "
                        "has none; start from a pretraining workdir or a model with its MLM head")
    fresh = [part for part in source.record.get("initialized", []) if "MLM" in part]
    if fresh and jax.process_index() == 0:
        print(f"note: {s.init_checkpoint} has no pretrained MLM head (it was initialized at "
              "import): the cloze scores start from a fresh head, so zero-shot accuracy is "
              "chance", file=sys.stderr)


def _record(s: FinetuneSettings, start: StartingPoint, data: TaskData, seed: int,
            tokenizer_dir: str, fresh: tuple[str, ...]) -> tuple[dict, dict]:
    """(compared, info) of run.json."""
    heads = data.task.heads_info()
    source_heads = (start.source.record.get("heads") or {}) if start.source else {}
    if HEADS_KEY in source_heads:  # an imported XLM-R fine-tuned exports as XLMRoberta* again
        heads[HEADS_KEY] = source_heads[HEADS_KEY]
    compared = {"task": s.task, "method": s.method.name, "model": layout_of(start.encoder),
                "heads": heads}
    info = {"encoder": start.encoder.record(), "tokenizer_dir": tokenizer_dir,
            "init_checkpoint": storage.absolute(s.init_checkpoint) if s.init_checkpoint else "",
            "seed": seed, "max_seq_len": s.task_settings.max_seq_len,
            "task_settings": data.task.recorded_settings(),
            "adaptation": {"method": s.method.name, "fresh": list(fresh)},
            # What re-ranking checks: a cross-encoder must have been trained on text pairs.
            "text_pairs": any(getattr(e, "text_pair", None) is not None
                              for e in data.train_examples[:1000])}
    if s.distill is not None:
        info["distill"] = dataclasses.asdict(s.distill)
    return compared, info


def _fresh_encoder_parts(s: FinetuneSettings, start: StartingPoint, stored: dict
                         ) -> tuple[str, ...]:
    """Encoder subtrees the warm start initializes rather than loads (a pooler the init
    checkpoint never trained), which a method that freezes the base trains all the same. Decided
    once, when the run starts, and read back from run.json on resume (a resumed run may read
    only the init checkpoint's records, which cannot always tell)."""
    if "adaptation" in stored:  # not "method": that key is compared with the config's on resume
        return tuple(stored["adaptation"].get("fresh", ()))
    source = start.source
    if not s.method.freezes_base or source is None:
        return ()
    trained = warm_start.pooler_was_trained(source.heads, source.record.get("initialized", []))
    return () if trained else (warm_start.UNTRAINED_POOLER,)


def train(s: FinetuneSettings, start: StartingPoint, data: TaskData, workdir: str, seed: int,
          stop) -> dict:
    """One fine-tuning run (resumed if the workdir holds one); returns its results."""
    mesh = s.mesh.make()
    common.check_batch_split(mesh, batch_size=s.train.batch_size // s.train.accumulation_steps,
                             eval_batch_size=s.train.eval_batch_size)
    run_dir = RunDirectory(workdir)
    done = loading.read_json(os.path.join(run_dir.path, RESULTS_FILE))
    tokenizer_dir = os.path.join(run_dir.path, "tokenizer")
    fresh = _fresh_encoder_parts(s, start, run_dir.stored)
    # run.json names the tokenizer where the workdir is (a bucket's, not this host's mirror)
    compared, info = _record(s, start, data, seed, storage.join(run_dir.location, "tokenizer"),
                             fresh)
    run_dir.check(compared)
    if done.get("finished"):
        print(f"nothing to do: the run in {run_dir.location} has finished ({RESULTS_FILE})",
              file=sys.stderr)
        return done
    with run_dir:
        run = FinetuneRun(s, start, data, run_dir, seed, mesh, fresh)
        try:
            if common.stopped_before_start(stop):
                return {"finished": False, "step": 0}
            if jax.process_index() == 0:
                _save_tokenizer(start.tokenizer, tokenizer_dir)
            run_dir.write_record(compared, info)
            last_step = run.loop(stop)
            run.checkpointer.wait()
            if last_step < run.total:
                return {"finished": False, "step": last_step}
            return run.finish()
        finally:
            run.close()


def _save_tokenizer(tokenizer: Tokenizer, directory: str) -> None:
    """The run's own copy of its vocabulary (what run.json's tokenizer_dir names)."""
    if not os.path.isdir(directory):
        staging = directory + ".tmp"
        tokenizer.save(staging)
        os.replace(staging, directory)


def train_restarts(s: FinetuneSettings, start: StartingPoint, data: TaskData, workdir: str,
                   stop) -> dict:
    """N runs with seeds seed .. seed + N - 1; the best by the main metric is named."""
    runs = []
    for k in range(s.train.restarts):
        if jax.process_index() == 0:
            print(f"restart {k + 1} of {s.train.restarts}", file=sys.stderr)
        result = train(s, start, data, os.path.join(workdir, f"restart_{k}"),
                       s.train.seed + k, stop)
        if not result.get("finished"):
            return result  # stopped (SIGTERM): the same command resumes this restart
        runs.append(result)
    metric = data.task.main_metric
    best = 0
    for k, result in enumerate(runs):
        if evaluation.is_better(metric, result["best_metric"], runs[best]["best_metric"]):
            best = k
    summary = {**runs[best], "best_restart": best, "best_workdir": runs[best]["workdir"],
               "workdir": storage.absolute(workdir),
               "restarts": [{"seed": r["seed"], "best_metric": r["best_metric"],
                             "best_step": r["best_step"], "workdir": r["workdir"]} for r in runs]}
    if jax.process_index() == 0:
        if storage.is_url(workdir):
            storage.write_bytes(storage.join(workdir, RESULTS_FILE),
                                (json.dumps(summary, indent=2) + "\n").encode())
        else:
            write_json(os.path.join(workdir, RESULTS_FILE), summary)
        print(f"best of {len(runs)} restarts: restart_{best} ({metric} "
              f"{evaluation.shown(runs[best]['best_metric'])})", file=sys.stderr)
    return summary
