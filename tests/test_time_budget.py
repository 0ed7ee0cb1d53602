"""Pretraining for a wall-clock budget: the rate the host sets is the one applied, the schedule is
laid over the budget, the run stops and checkpoints once it is spent (its last step evaluated),
checkpoints every so many minutes, and a rerun of a spent budget trains nothing."""

import os

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import cli_in_process
from bertjax.train import time_budget
from bertjax.train.optimizer import (OptimizerConfig, applied_learning_rate, make_optimizer,
                                     make_schedule)
from pretrain_runs import tiny_args
from test_pretrain import logged


class FakeClock(time_budget.BudgetClock):
    def __init__(self, budget_s, now=0.0):
        super().__init__(budget_s)
        self.now = now

    def spent(self):
        return self.spent_before_s + self.now


def _params():
    return {"dense": {"kernel": jnp.ones((3, 2)), "bias": jnp.zeros(2)}}


def test_the_host_rate_is_the_rate_applied_and_the_layout_is_the_schedules():
    config = OptimizerConfig(learning_rate=1e-3, warmup_steps=0, total_steps=10, decay="constant",
                             bias_correction=True)
    scheduled, hosted = make_optimizer(config), make_optimizer(config, host_rate=True)
    params, grads = _params(), jax.tree.map(lambda p: jnp.full_like(p, 0.5), _params())
    assert jax.tree.structure(scheduled.init(params)) == jax.tree.structure(hosted.init(params))

    class State:  # what BudgetRate.apply replaces the optimizer state of
        def __init__(self, opt_state):
            self.opt_state = opt_state

        def replace(self, opt_state):
            return State(opt_state)

    rate = time_budget.BudgetRate(lambda step: 1e-3, 10, FakeClock(60.0))
    state = rate.apply(State(hosted.init(params)))
    expected, _ = scheduled.update(grads, scheduled.init(params), params)
    got, opt_state = hosted.update(grads, state.opt_state, params)
    for a, b in zip(jax.tree.leaves(expected), jax.tree.leaves(got)):
        np.testing.assert_allclose(a, b, rtol=1e-6)
    assert float(applied_learning_rate(opt_state)) == pytest.approx(1e-3)


def test_the_schedule_is_laid_over_the_budget():
    config = OptimizerConfig(learning_rate=1e-3, warmup_steps=100, total_steps=1000)
    clock = FakeClock(600.0)
    rate = time_budget.BudgetRate(make_schedule(config), 1000, clock)
    for seconds, expected in ((0, 0.0), (30, 5e-4), (60, 1e-3), (330, 5e-4), (600, 0.0),
                              (900, 0.0)):
        clock.now = seconds
        assert rate.rate() == pytest.approx(expected, abs=1e-9), seconds
    clock.resume_from(300.0)  # a resumed run counts on from its checkpoint's clock
    clock.now = 30
    assert clock.fraction() == pytest.approx(0.55)
    assert rate.rate() == pytest.approx(1e-3 * 450 / 900)


def test_checkpoints_every_so_many_minutes_count_on_after_a_resume():
    clock, fired = FakeClock(0.0), []
    hook = time_budget.EveryMinutes(1.0, clock, lambda step, state, metrics: fired.append(step))
    for step, seconds in enumerate((10, 59, 61, 70, 125, 130, 500), start=1):
        clock.now = seconds
        hook(step, None, None, final=False)
    assert fired == [3, 5, 7]
    clock, fired = FakeClock(0.0), []
    clock.resume_from(150.0)
    hook = time_budget.EveryMinutes(1.0, clock, lambda step, state, metrics: fired.append(step))
    for step, seconds in enumerate((10, 31, 40), start=1):
        clock.now = seconds
        hook(step, None, None, final=False)
    assert fired == [2]  # 180 s, the first multiple after the 150 s already spent


# Compiling counts against it; what is left still holds hundreds of the tiny model's steps.
BUDGET_S = 14.0


def _budget_args(workdir, corpus_dir, **overrides):
    settings = {"train.time_budget_minutes": BUDGET_S / 60, "train.steps": 1_000_000,
                "train.checkpoint_every": 1_000_000, "train.checkpoint_every_minutes": 0.07,
                "train.keep_checkpoints": 0, "train.log_every": 20, "train.eval_every": 1_000_000,
                "schedule.long_fraction": 0.0, "optimizer.warmup_steps": 100_000,
                "optimizer.learning_rate": 1e-3,
                "train.fill_mask_examples": "the [MASK] of the city | in [MASK] he was born",
                **overrides}
    return tiny_args(workdir, corpus_dir, **settings)[1:]


@pytest.fixture(scope="module")
def budget_run(tmp_path_factory, small_corpus_dir):
    workdir = str(tmp_path_factory.mktemp("budget") / "run")
    result = cli_in_process.run("main", *_budget_args(workdir, small_corpus_dir))
    assert result.returncode == 0, result.stderr[-3000:]
    return workdir, result


@pytest.mark.slow
def test_a_budget_run_stops_when_spent_with_its_last_step_evaluated_and_saved(budget_run):
    workdir, result = budget_run
    assert "time budget spent: stopping after step" in result.stderr
    assert "continue:" not in result.stderr  # the run is done, not paused
    records = logged(workdir)
    train = [r for r in records if "loss" in r]
    last = max(r["step"] for r in train)
    assert 1 <= last < 1_000_000
    spent = [r["budget_spent_s"] for r in train]
    assert spent == sorted(spent) and spent[-1] >= BUDGET_S
    assert any(r["step"] == last and "eval_mlm_loss" in r for r in records)
    steps = sorted(int(d) for d in os.listdir(os.path.join(workdir, "checkpoints"))
                   if d.isdigit())
    assert steps[-1] == last and len(steps) >= 2  # every 4.2 s, then the last step
    # The warmup is 10% of train.steps, so 10% of the budget: the rate follows the clock (by the
    # step count, 100,000 steps of warmup would keep it near 0 for the whole run).
    schedule = make_schedule(OptimizerConfig(learning_rate=1e-3, warmup_steps=100_000,
                                             total_steps=1_000_000))
    # A record's rate is its last step's, set when the host dispatched that step, after the
    # hooks of the step before. The record's clock is read once the step has run, and the logging
    # hook writes a record one step late (at the next step's hooks: the host runs ahead of the
    # device, on a loaded machine by seconds). So the rate was set before this record's clock and
    # after that of the last record at least two steps earlier: a final record one step after
    # the last regular one (steps 40 and 41) was dispatched before step 40's clock was read.
    clocks = []  # (step, budget_spent_s) of the records so far
    for record in train:
        before = [seconds for step, seconds in clocks if step <= record["step"] - 2]
        spent = np.linspace(before[-1] if before else 0.0, record["budget_spent_s"], 201)
        rates = np.asarray(schedule(np.minimum(spent / BUDGET_S, 1.0) * 1_000_000))
        assert rates.min() - 1e-5 <= record["learning_rate"] <= rates.max() + 1e-5, (
            clocks, record)
        clocks.append((record["step"], record["budget_spent_s"]))
    # By the step count the rate would be schedule(step) (under 1e-5 at any step here); by the
    # clock it is over 2e-4 from the first 0.3 s to 80% of the budget. A record that early must
    # show it. (On a loaded machine there may be none: the bounds above still hold.)
    early = [r for r in train if r["budget_spent_s"] < 0.8 * BUDGET_S]
    assert all(r["learning_rate"] > 10 * float(schedule(r["step"])) for r in early), early
    assert train[-1]["learning_rate"] < 1e-4


@pytest.mark.slow
def test_the_finished_run_fills_in_its_examples(budget_run):
    _, result = budget_run
    shown = result.stderr[result.stderr.index("fill-mask, the trained model's top 5"):]
    lines = shown.splitlines()
    assert lines[1].strip() == "the [MASK] of the city"
    assert lines[3].strip() == "in [MASK] he was born"
    for guesses in (lines[2], lines[4]):  # five "token probability" pairs
        fields = guesses.split()
        assert len(fields) == 10 and all(0 <= float(p) <= 1 for p in fields[1::2])


@pytest.mark.slow
def test_a_rerun_of_a_spent_budget_trains_nothing(budget_run, small_corpus_dir):
    workdir, _ = budget_run
    before = sorted(os.listdir(os.path.join(workdir, "checkpoints")))
    result = cli_in_process.run("main", *_budget_args(workdir, small_corpus_dir))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "nothing left to train" in result.stderr
    assert sorted(os.listdir(os.path.join(workdir, "checkpoints"))) == before


def test_a_budget_with_two_length_phases_is_refused(tmp_path, small_corpus_dir):
    workdir = str(tmp_path / "refused")
    result = cli_in_process.run("main", *_budget_args(workdir, small_corpus_dir,
                                                      **{"schedule.long_fraction": 0.34}))
    assert result.returncode == 2 and not os.path.exists(workdir)
    assert result.stderr.strip().splitlines()[-1].startswith("bertjax: error: train.time_budget_minutes")
    result = cli_in_process.run("main", *_budget_args(
        workdir, small_corpus_dir, **{"train.time_budget_minutes": -1}))
    assert result.returncode == 2 and "must not be negative" in result.stderr
    result = cli_in_process.run("main", *_budget_args(
        workdir, small_corpus_dir, **{"train.fill_mask_examples": "a [MASK] b | no mask"}))
    assert result.returncode == 2 and "'no mask' has no [MASK]" in result.stderr
    assert not os.path.exists(workdir)
