"""What a run reports of its own speed: step time, tokens/s and MFU in every step record
(bertjax/train/step_timing.py), and a jax.profiler trace of train.profile_steps
(bertjax/train/profiling.py)."""

import glob
import os

import jax
import jax.numpy as jnp
import pytest

from bertjax.cli import main
from bertjax.core import storage, transfer
from bertjax.model.config import preset
from bertjax.model.flops import train_step_flops
from bertjax.parallel import chips
from bertjax.train import step_timing
from bertjax.train.metrics_log import read_metrics
from bertjax.train.profiling import StepProfiler
from pretrain_runs import SHORT, tiny_args
import run_devices


class FakeClock:
    """time.perf_counter as the test sets it: timing logic checked without timing anything."""

    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


@pytest.fixture
def clock(monkeypatch):
    fake = FakeClock()
    monkeypatch.setattr(step_timing.time, "perf_counter", fake)
    return fake


def test_the_first_step_of_each_program_and_pauses_are_left_out(clock):
    timer = step_timing.StepTimer(lambda step: 100 * step, executable_of=lambda step: step > 3,
                                  flops_in_step=lambda step: 1e6, peak_flops_per_s=1e7)
    metrics = jnp.zeros(())
    clock.now += 50.0  # start-up, compiling: before the first step has finished
    timer.step(1, metrics)  # the first program's first step: the clock restarts after it
    for step in (2, 3):
        timer.step(step, metrics)
    clock.now += 2.0
    with timer.paused():  # an evaluation, say; nested pauses count once
        with timer.paused():
            clock.now += 7.0
    fields = timer.fields()
    assert fields["step_time_s"] == pytest.approx(1.0)
    assert fields["tokens_per_sec"] == pytest.approx((200 + 300) / 2.0)
    assert fields["steps_per_sec"] == pytest.approx(1.0)
    assert fields["mfu"] == pytest.approx(2e6 / 2.0 / 1e7)

    timer.step(4, metrics)  # the second program's first step: not timed
    clock.now += 3.0
    assert timer.fields() == {}
    timer.step(5, metrics)
    clock.now += 0.5
    assert timer.fields()["step_time_s"] == pytest.approx(0.5)


def test_without_a_peak_there_is_no_mfu(clock):
    timer = step_timing.StepTimer(lambda step: 8, flops_in_step=lambda step: 1e6)
    for step in (1, 2):
        timer.step(step, jnp.zeros(()))
    clock.now += 1.0
    assert set(timer.fields()) == {"step_time_s", "tokens_per_sec", "steps_per_sec"}
    assert step_timing.peak_flops_per_s(jax.devices()) is None  # a CPU has no figures


@pytest.mark.parametrize("kind, family", [
    ("TPU v4", "v4"), ("TPU v5 lite", "v5e"), ("TPU v5", "v5p"), ("TPU v5p", "v5p"),
    ("TPU v6 lite", "v6e"), ("cpu", None), ("NVIDIA H200", "h200"), ("NVIDIA H100 80GB HBM3", "h100"),
    ("NVIDIA A100-SXM4-80GB", None), ("TPU v4 lite", None)])
def test_device_kinds_name_their_chip(kind, family):
    chip = chips.chip_of(kind)
    assert (chip.family if chip else None) == family


class FakeDevice:
    def __init__(self, kind):
        self.device_kind = kind


def test_the_peak_is_the_chips_peak_times_the_devices():
    assert step_timing.peak_flops_per_s([FakeDevice("TPU v5 lite")] * 8) == 8 * 197e12


@pytest.mark.tpu_compile
def test_libtpus_devices_are_found_in_the_chip_table():
    from bertjax.aot import topology

    for name in ("v4-8", "v5e-8", "v5p-8", "v6e-8"):
        slice_ = topology.parse(name)
        kind = topology.devices(slice_)[0].device_kind
        assert chips.chip_of(kind) == slice_.chip, (name, kind)


def traces(directory):
    return glob.glob(os.path.join(directory, "plugins", "profile", "*", "*.xplane.pb"))


def run_hooks(profiler, steps):
    step_fn = jax.jit(lambda x: x + 1.0)
    x = jnp.zeros(())
    with profiler:
        for step in steps:
            x = step_fn(x)
            profiler(step, None, x, final=False)


def test_a_trace_covers_the_steps_after_start_up_to_end(tmp_path, capsys):
    run_hooks(StepProfiler(str(tmp_path), (2, 4), 0), range(1, 7))
    (trace,) = traces(str(tmp_path / "profile"))
    planes = [p.name for p in jax.profiler.ProfileData.from_file(trace).planes]
    assert "/host:CPU" in planes, planes
    assert "profiler trace of steps 3-4" in capsys.readouterr().err


def test_a_run_ending_inside_the_range_writes_its_trace_and_a_resume_past_it_none(tmp_path,
                                                                                  capsys):
    run_hooks(StepProfiler(str(tmp_path / "a"), (2, 8), 0), range(1, 4))  # ends at step 3
    assert len(traces(str(tmp_path / "a" / "profile"))) == 1
    assert "profiler trace of steps 3-3" in capsys.readouterr().err
    run_hooks(StepProfiler(str(tmp_path / "b"), (2, 4), 4), range(5, 7))  # resumed past END
    assert not os.path.exists(tmp_path / "b" / "profile")


def test_a_resume_inside_the_range_traces_what_is_left_of_it(tmp_path, capsys):
    run_hooks(StepProfiler(str(tmp_path), (2, 6), 3), range(4, 9))
    assert len(traces(str(tmp_path / "profile"))) == 1
    assert "profiler trace of steps 4-6" in capsys.readouterr().err


def test_step_records_carry_step_time_and_throughput(finished_short_run):
    """1 CPU device, 8 x 32 tokens a step, a record a step: the first step is not timed."""
    train = [r for r in read_metrics(finished_short_run) if "loss" in r]
    assert [r["step"] for r in train] == list(range(1, 7))
    assert not {"step_time_s", "tokens_per_sec", "steps_per_sec"} & set(train[0])
    for record in train[1:]:
        assert record["step_time_s"] > 0
        assert record["tokens_per_sec"] == pytest.approx(8 * 32 / record["step_time_s"])
        assert record["steps_per_sec"] == pytest.approx(1 / record["step_time_s"])
        assert "mfu" not in record  # no peak for a CPU


@pytest.mark.parametrize("value", ["4,2", "2,2", "2", "a,b", "-1,3", "1,2,3", "6,9"])
def test_bad_profile_steps_exit_2_with_one_line(tmp_path, small_corpus_dir, capsys, value):
    workdir = tmp_path / "wd"
    args = tiny_args(str(workdir), small_corpus_dir, **{**SHORT, "train.profile_steps": value})
    assert main.main(args) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("bertjax: error:") and "\n" not in err, err
    assert "train.profile_steps" in err, err
    assert not workdir.exists()


@pytest.mark.slow
def test_a_profiled_run_writes_a_trace_of_its_steps(tmp_path, small_corpus_dir,
                                                              capsys):
    workdir = tmp_path / "wd"
    args = tiny_args(str(workdir), small_corpus_dir,
                     **{**SHORT, "train.profile_steps": "2,4"}, **run_devices.IN_A_WORKER)
    assert main.main(args) == 0
    assert "profiler trace of steps 3-4" in capsys.readouterr().err
    (trace,) = traces(str(workdir / "profile"))
    profile = jax.profiler.ProfileData.from_file(trace)
    events = {event.name for plane in profile.planes for line in plane.lines
              for event in line.events}
    assert any("train" in name for name in events), sorted(events)[:50]
    records = [r for r in read_metrics(str(workdir)) if "loss" in r]
    assert all(r["step_time_s"] > 0 for r in records[1:])


def test_mfu_counts_the_model_flops_of_the_phase(clock):
    """What a TPU run's records carry: the analytic FLOPs over the step time and the peak."""
    flops = train_step_flops(preset("tiny"), 8, 32, 5).total
    timer = step_timing.StepTimer(lambda step: 8 * 32, flops_in_step=lambda step: flops,
                                  peak_flops_per_s=step_timing.peak_flops_per_s(
                                      [FakeDevice("TPU v4")] * 2))
    for step in (1, 2, 3):
        timer.step(step, jnp.zeros(()))
    clock.now += 0.01
    assert timer.fields()["mfu"] == pytest.approx(2 * flops / 0.01 / (2 * 275e12))


@pytest.mark.gcs
def test_a_trace_of_a_run_on_a_bucket_reaches_the_bucket(gcs_bucket, small_corpus_dir, capsys):
    workdir = f"gs://{gcs_bucket}/run"
    args = tiny_args(workdir, small_corpus_dir,
                     **{**SHORT, "train.profile_steps": "1,3"}, **run_devices.IN_A_WORKER)
    assert main.main(args) == 0
    assert "profiler trace of steps 2-3" in capsys.readouterr().err
    (name,) = [n for n in transfer.remote_files(workdir) if n.endswith(".xplane.pb")]
    assert name.startswith("profile/plugins/profile/")
    space = storage.read_bytes(storage.join(workdir, name))
    planes = jax.profiler.ProfileData.from_serialized_xspace(space).planes
    assert "/host:CPU" in [p.name for p in planes]


def test_a_window_fetched_inside_a_pause_leaves_out_only_its_own_part(clock):
    timer = step_timing.StepTimer(lambda step: 1)
    for step in (1, 2):
        timer.step(step, jnp.zeros(()))
    clock.now += 1.0
    with timer.paused():
        clock.now += 4.0
        assert timer.fields()["step_time_s"] == pytest.approx(1.0)
        clock.now += 4.0
    timer.step(3, jnp.zeros(()))
    clock.now += 2.0
    assert timer.fields()["step_time_s"] == pytest.approx(2.0)
