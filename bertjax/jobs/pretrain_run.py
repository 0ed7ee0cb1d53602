"""One pretraining run inside its opened workdir: the objective's model, the train step compiled
for every length phase still to run, the state restored or initialized (and warm-started), and the
loop with its hooks (log, eval, checkpoint); at the end, curves and where the outputs are."""

from __future__ import annotations

import contextlib
import sys

import jax

from bertjax.core import storage, storage_deadline
from bertjax.core.errors import UserError
from bertjax.inference import api, loading
from bertjax.jobs import common, pretrain_fit, pretraining_model
from bertjax.jobs.run_directory import RunDirectory
from bertjax.model import gdes
from bertjax.parallel import partitioning
from bertjax.settings.pretrain import PretrainSettings
from bertjax.parallel import distributed
from bertjax.train import checkpoint_deadlines, loop, step_timing, time_budget, warm_start
from bertjax.train.checkpoint import Checkpointer
from bertjax.train.logging_hook import LoggingHook, window_summary
from bertjax.train.metrics_log import MetricsWriter, NonFiniteLossError, truncate_after
from bertjax.train.optimizer import make_optimizer, make_schedule
from bertjax.train.plots import plot_curves
from bertjax.train.profiling import StepProfiler
from bertjax.train.state import param_count
from bertjax.train.step import make_eval_step
from bertjax.train.warm_start import UNTRAINED_POOLER


class PretrainRun:
    """Built (and every phase's step compiled, from shapes alone) before any state exists: a
    config that does not fit (under train.fit=auto: with any setting tried) is refused before a
    byte of it is allocated. `data(mesh)` gives the training iterator and eval batches over the
    chosen mesh; `source` the init checkpoint (its params when the run starts fresh), or None."""

    def __init__(self, s: PretrainSettings, run_dir: RunDirectory, encoder, data,
                 source: loading.Loaded | None):
        self.s, self.run_dir, self.source = s, run_dir, source
        self.workdir = run_dir.path
        self.encoder = encoder
        self.is_main = jax.process_index() == 0
        # Only NSP reads the pooled output: without it the pooler gets no gradient, only decay.
        untrained = () if s.objective.nsp else (UNTRAINED_POOLER,)
        self.clock = self._clock()
        self.optimizer = make_optimizer(s.optimizer, untrained=untrained,
                                        host_rate=bool(s.train.time_budget_minutes))
        self.budget_rate = time_budget.BudgetRate(
            make_schedule(s.optimizer), s.train.steps, self.clock
        ) if s.train.time_budget_minutes else None
        chosen = self._compile(encoder)
        # The setting train.fit chose (the config's own when it fits): what the run trains with.
        self.s, self.mesh, self.encoder = chosen.s, chosen.mesh, chosen.encoder
        self.model, self.objective = chosen.model, chosen.objective
        self.phase_models, self.plan = chosen.phase_models, chosen.plan
        self.data = data(self.mesh)
        self.checkpointer: Checkpointer | None = None

    def _clock(self) -> time_budget.BudgetClock:
        """Started before compilation: a budget counts the job's wall time, compiling included."""
        train = self.s.train
        if (train.time_budget_minutes or train.checkpoint_every_minutes) and \
                distributed.is_multi_process():
            raise UserError("train.time_budget_minutes and train.checkpoint_every_minutes read "
                            "one process's clock: run them on one host")
        return time_budget.BudgetClock(train.time_budget_minutes * 60.0)

    def _compile(self, encoder) -> pretrain_fit.Candidate:
        """The train step per sequence length of the phases not yet done, under the setting
        train.fit chooses (kept as self.fit, with its run.json record)."""
        s, schedule = self.s, self.s.schedule
        done = max(loading.checkpoint_steps(self.run_dir.checkpoints), default=0)
        search = pretrain_fit.StepSearch(s, encoder, self.optimizer,
                                         device_memory_gb=s.train.device_memory_gb,
                                         recorded=self.run_dir.stored.get(pretrain_fit.RECORD_KEY))
        if done:  # a checkpoint of another shape is refused now, not after compiling
            with Checkpointer(self.run_dir.checkpoints, keep=None, read_only=True) as saved:
                saved.refuse_another_model(search.start.plan.abstract)
        fit, chosen = search.run([phase for phase in schedule.phases
                                  if schedule.phase_end(phase, s.train.steps) > done])
        self.compiled, self.fit_record = fit.compiled, search.record(fit)
        if self.is_main:  # once every phase fits: a config refused for a later one prints one line
            pretrain_fit.print_lines([search.resumed_line()] if search.resumed_line() else [])
            pretrain_fit.print_lines(fit.lines())
            pretrain_fit.print_lines([step.report for step in self.compiled.values()])
        return chosen

    def _warm_start(self):
        """The init checkpoint's parameters in place of fresh ones, when the run has them."""
        source = self.source
        if source is None or source.params is None:
            return None

        def warm(params, param_shardings):
            # An ELECTRA checkpoint with GDES gives the generator's table and E_Δ back.
            return warm_start.load_params(self.s.init_checkpoint,
                                          gdes.training_params(source.params, params), params,
                                          param_shardings)
        return warm

    def train(self, stop, compared: dict, info: dict) -> dict:
        """Restores or initializes the state, records the run (run.json: `compared` and `info`)
        and trains to train.steps; returns the last logged metrics ({} when stopped before)."""
        if common.stopped_before_start(stop):
            return {}
        s = self.s
        self.checkpointer = Checkpointer(self.run_dir.checkpoints, keep=s.train.keep_checkpoints)
        start = common.restore_or_init(self.plan, self.checkpointer, self._warm_start())
        self.run_dir.write_record(compared, {**info, "encoder": self.encoder.record(),
                                             pretrain_fit.RECORD_KEY: self.fit_record})
        if self.is_main:
            if start.step:
                truncate_after(self.workdir, start.step, shown=self.run_dir.location)
                print(f"resuming from step {start.step} of {s.train.steps} "
                      f"({self.checkpointer.directory})", file=sys.stderr)
            print(f"model: {s.model.preset} ({param_count(start.state.params):,} parameters), "
                  f"objective {s.objective.name}, mesh {dict(self.mesh.shape)}", file=sys.stderr)
        if common.stopped_before_start(stop):
            return {}
        return self._loop(stop, start)

    def close(self) -> None:
        if self.checkpointer is not None:
            self.checkpointer.close()

    def _step(self, state, local_batch):
        seq_len = local_batch["input_ids"].shape[1]
        if self.budget_rate is not None:
            state = self.budget_rate.apply(state)
        return self.compiled[seq_len](state, partitioning.global_batch(local_batch, self.mesh))

    def _loop(self, stop, start: common.Start) -> dict:
        s, total_steps = self.s, self.s.train.steps
        self.eval_steps = {seq_len: make_eval_step(model, self.mesh, start.shardings,
                                                   objective=self.objective)
                           for seq_len, model in self.phase_models.items()}
        self.eval_cache: dict = {}  # seq_len (or ("languages", seq_len)) -> placed batches
        saved = dict(start.saved)
        self.clock.resume_from(saved.pop(time_budget.SPENT_KEY, 0.0))
        if s.train.time_budget_minutes:
            if start.step and self.clock.exhausted:  # a fresh run takes at least one step
                print(f"the time budget ({s.train.time_budget_minutes:g} minutes) was spent "
                      f"by step {start.step}: nothing left to train", file=sys.stderr)
                return {}
            stop = time_budget.BudgetStop(stop or loop.default_stop_source(), self.clock)
        self.batches = self.data.train_iterator(start.step, end_step=total_steps)
        if saved:
            self.batches.set_state(saved)
        self.writer = MetricsWriter(self.workdir, enabled=self.is_main)
        progress = loop.Progress(start.step, total_steps, enabled=self.is_main)
        self.logger = LoggingHook(
            self.writer, s.train.log_every, summarize=self.objective.summarize,
            step_info=self._step_info, timer=self._timer(), progress=progress)
        profiler = StepProfiler(self.workdir, s.train.profiled_steps(), start.step,
                                untimed=self.logger.untimed, written=self.run_dir.push)
        hooks = [self.logger, profiler, loop.Every(s.train.checkpoint_every, self._checkpoint),
                 time_budget.EveryMinutes(s.train.checkpoint_every_minutes, self.clock,
                                          self._checkpoint)]
        if s.train.eval_every and s.train.eval_batches and self.data.has_eval_data:
            hooks.append(loop.Every(s.train.eval_every, self._evaluate))
        try:
            with profiler:  # a run ending before train.profile_steps' END stops the trace too
                _, last_step = loop.run(
                    start.state, self.batches, start_step=start.step, total_steps=total_steps,
                    step_fn=self._step, hooks=hooks,
                    on_stop=lambda step, state: self._checkpoint(step, state, None),
                    progress=progress, stop_source=stop)
            self.checkpointer.wait()
        except NonFiniteLossError as e:
            left = self.checkpointer.set_aside_diverged(e.first_bad_checkpoint)
            raise NonFiniteLossError(f"{e}; {left}", e.first_bad_checkpoint) from None
        finally:
            self.batches.close()
            self.writer.close()
        if self.is_main:
            if s.train.plot:
                plot_curves(self.workdir)
            self.run_dir.push()
            finished = last_step == total_steps or getattr(stop, "budget_spent", False)
            report_outputs(self.run_dir.location, last_step, total_steps, s.train.plot,
                           finished)
            if finished and s.train.fill_mask_examples:
                print(filled_masks(self.run_dir.location, s.train.fill_mask_examples),
                      file=sys.stderr)
        return self.logger.last_logged

    def _timer(self) -> step_timing.StepTimer:
        """Tokens (padding included) and model FLOPs a step by its phase; MFU on the mesh's
        devices' peak, where their chip has one (bertjax/parallel/chips.py)."""
        s = self.s
        flops = {phase.seq_len: pretraining_model.step_flops(s, self.encoder, phase)
                 for phase in s.schedule.phases}

        def seq_len(step: int) -> int:  # the phase's, and so the compiled step's
            return s.schedule.phase_at(step - 1).seq_len

        return step_timing.StepTimer(
            lambda step: s.train.batch_size * seq_len(step), executable_of=seq_len,
            flops_in_step=lambda step: flops[seq_len(step)],
            peak_flops_per_s=step_timing.peak_flops_per_s(self.mesh.devices.flat))

    def _step_info(self, step: int) -> dict:
        # The data's wait and bytes fetched since the previous line.
        info = {"seq_len": self.s.schedule.phase_at(step - 1).seq_len, **self.batches.counters()}
        if self.s.train.time_budget_minutes:  # what a budget's curves are drawn against
            info["budget_spent_s"] = round(self.clock.spent(), 2)
        return info

    def _evaluate(self, step: int, state, _metrics) -> None:
        """The eval loss on train.eval_batches held-out batches of the step's phase (placed once
        per sequence length)."""
        with self.logger.untimed():
            phase = self.s.schedule.phase_at(step - 1)
            if phase.seq_len not in self.eval_cache:
                self.eval_cache[phase.seq_len] = [
                    partitioning.global_batch(b, self.mesh)
                    for b in self.data.eval_batches(phase, self.s.train.eval_batches)]
            eval_step = self.eval_steps[phase.seq_len]
            sums = [eval_step(state.params, b) for b in self.eval_cache[phase.seq_len]]
            if sums:
                summary = window_summary(jax.device_get(sums), self.objective.summarize)
                self.writer.write(step, {f"eval_{k}": v for k, v in summary.items()})
            if hasattr(self.data, "eval_batches_by_language"):  # multilingual: per language too
                self._evaluate_languages(step, state, phase, eval_step)

    def _evaluate_languages(self, step: int, state, phase, eval_step) -> None:
        """eval_<metric>_<language> on each language's own held-out batches."""
        key = ("languages", phase.seq_len)
        if key not in self.eval_cache:
            self.eval_cache[key] = {
                code: [partitioning.global_batch(b, self.mesh) for b in batches]
                for code, batches in self.data.eval_batches_by_language(
                    phase, self.s.train.eval_batches).items()}
        record = {}
        for code, batches in self.eval_cache[key].items():
            sums = [eval_step(state.params, b) for b in batches]
            summary = window_summary(jax.device_get(sums), self.objective.summarize)
            record.update({f"eval_{k}_{code}": v for k, v in summary.items()})
        if record:
            self.writer.write(step, record)

    def _checkpoint(self, step: int, state, metrics) -> None:
        """The state with the data iterator's position: a resume continues bit for bit."""
        with self.logger.untimed():  # writes the log first: it must reach the checkpoint's step
            self._save(step, state, metrics)

    def _save(self, step: int, state, metrics) -> None:
        # A workdir on a bucket gets the lines logged so far before the checkpoint exists: a run
        # killed once it is saved resumes from it with every line up to it.
        self.writer.flush()
        # On a bucket, a failure here (an error, or the storage deadline ending the command)
        # says what stays restorable.
        unsaved = contextlib.nullcontext()
        if self.run_dir.remote:
            unsaved = storage_deadline.unfinished(checkpoint_deadlines.unsaved(
                step, self.checkpointer.directory, self.checkpointer.latest_step()))
        with unsaved:
            self.run_dir.push()
            data_state = self.batches.get_state()
            if self.s.train.time_budget_minutes or self.s.train.checkpoint_every_minutes:
                data_state = {**data_state, time_budget.SPENT_KEY: self.clock.spent()}
            self.checkpointer.save(step, state, data_state, metrics=metrics)


def filled_masks(workdir: str, examples: str) -> str:
    """The trained MLM head's guesses for each [MASK] of the "|"-separated examples."""
    texts = [t.strip() for t in examples.split("|") if t.strip()]
    model = api.load(workdir)
    lines = ["\nfill-mask, the trained model's top 5 (python -c \"import bertjax; "
             f"print(bertjax.load('{workdir}').fill_mask('... [MASK] ...'))\"):"]
    for text, masks in zip(texts, model.fill_mask(texts)):
        lines.append(f"  {text}")
        lines += ["      " + "  ".join(f"{token} {p:.2f}" for token, p in guesses)
                  for guesses in masks]
    return "\n".join(lines)


def report_outputs(workdir: str, step: int, total_steps: int, plotted: bool,
                   finished: bool) -> None:
    lines = [f"\nstep {step} of {total_steps}; workdir {workdir}",
             f"  checkpoints: {storage.join(workdir, 'checkpoints')}",
             f"  metrics:     {storage.join(workdir, 'metrics.jsonl')} "
             f"(TensorBoard: {storage.join(workdir, 'tensorboard')})"]
    if plotted:
        lines.append(f"  curves:      {storage.join(workdir, 'curves.png')}")
    if not finished:
        lines.append("  continue:    run the same command again; it resumes from the checkpoint")
    else:
        lines += ["  fine-tune:   python -m bertjax.main --config=configs/finetune_sentiment.py "
                  f"--workdir=DIR --config.init_checkpoint={workdir}",
                  f"  export:      python -m bertjax.export --workdir {workdir} --format hf "
                  "--output DIR"]
    print("\n".join(lines), file=sys.stderr)
