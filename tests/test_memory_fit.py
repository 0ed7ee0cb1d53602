"""train.fit=auto: the search over the memory levers (remat, then accumulation, then fsdp) on a
fake compile whose memory follows a stated model, and on CPU a tiny run whose phase does not fit
train.device_memory_gb as configured training with the setting chosen, recorded in run.json and
kept when the run resumes."""

import json
import os
import signal
import types

import numpy as np
import pytest

import cli_in_process
from bertjax.aot import report, topology
from bertjax.cli import compile as compile_cli
from bertjax.core.errors import UserError
from bertjax.inference import loading
from bertjax.settings import pretrain as pretrain_settings
from bertjax.train import memory_fit
from bertjax.train.compilation import DoesNotFit
from bertjax.train.memory_fit import Levers
from bertjax.train.metrics_log import read_metrics
from bertjax.train.step_timing import TIMING_FIELDS
from configs import tiny
from pretrain_runs import run_child, tiny_args
from trees import flat

MiB = 2**20
PHASES = [(512, "train step at 512 tokens"), (128, "train step at 128 tokens")]
REMAT = {"none": 1.0, "save_dots": 0.5, "full": 0.25}


class FakeDevice:
    """A step needing `fixed` MiB (parameters, optimizer state) shared over fsdp, plus
    `activations` MiB a token x 512 rows, scaled by the remat policy and split by accumulation;
    over `limit` MiB it is refused as compile_step refuses. Records every compile."""

    def __init__(self, fixed, activations, limit=100):
        self.fixed, self.activations, self.limit = fixed, activations, limit
        self.calls = []

    def __call__(self, levers, seq_len):
        self.calls.append((levers, seq_len))
        need = int((self.fixed / levers.fsdp + self.activations * seq_len / 512
                    * REMAT[levers.remat] / levers.accumulation) * MiB)
        if need > self.limit * MiB:
            raise DoesNotFit(f"train step at {seq_len} tokens", need, self.limit * MiB,
                             "train.device_memory_gb")
        return f"step {seq_len} {levers}", need

    def search(self, start=Levers("none", 1, 1, 8), mode="auto", batch_size=256):
        return memory_fit.search(start, PHASES, self, limit=self.limit * MiB,
                                 batch_size=batch_size, mode=mode)

    def tried(self):
        """The candidates compiled, in order."""
        return list(dict.fromkeys(levers for levers, _ in self.calls))


def test_a_config_that_fits_is_compiled_once_a_phase_and_left_as_it_is():
    device = FakeDevice(fixed=10, activations=80)
    fit = device.search()
    assert device.calls == [(Levers("none", 1, 1, 8), 512), (Levers("none", 1, 1, 8), 128)]
    assert fit.levers == Levers("none", 1, 1, 8) and fit.lines() == []
    assert fit.compiled == {512: f"step 512 {fit.levers}", 128: f"step 128 {fit.levers}"}
    assert fit.record()["changed"] == {}
    assert fit.record()["phases"]["512"]["line"] == "fits as configured (90.0 MiB)"


def test_remat_comes_first_and_a_candidate_is_dropped_at_its_first_misfit():
    device = FakeDevice(fixed=10, activations=150)  # none 160, save_dots 85 of 100
    fit = device.search()
    # The 512-token phase first: the configured setting fails there, 128 is never compiled.
    assert device.calls == [(Levers("none", 1, 1, 8), 512), (Levers("save_dots", 1, 1, 8), 512),
                            (Levers("save_dots", 1, 1, 8), 128)]
    assert fit.levers.changes(Levers("none", 1, 1, 8)) == {"model.remat": "save_dots"}
    assert fit.compiled[128] == f"step 128 {fit.levers}"  # the chosen steps, compiled once
    first, chosen = fit.lines()
    assert first == ("fit: as configured: train step at 512 tokens needs 160.0 MiB but a device "
                     "holds 100.0 MiB (train.device_memory_gb)")
    assert chosen.startswith("fit: chose model.remat=save_dots (train.fit=auto): phase 512 needs "
                             "85.0 MiB; phase 128 needs")
    record = fit.record()
    assert record["settings"] == {"model.remat": "save_dots", "train.accumulation_steps": 1,
                                  "mesh.fsdp": 1, "mesh.data": 8}
    assert record["phases"]["512"]["line"].endswith("fits with model.remat=save_dots (85.0 MiB)")
    assert record["phases"]["128"]["line"] == "fits with model.remat=save_dots (28.8 MiB)"


def test_a_chosen_setting_keeps_ten_percent_headroom_the_configured_one_does_not():
    assert FakeDevice(fixed=10, activations=85).search().levers.remat == "none"  # 95 of 100
    # save_dots needs 92.5 MiB: within the device, not within 90% of it; full (74 MiB) is.
    assert FakeDevice(fixed=55, activations=75).search().levers.remat == "full"


def test_accumulation_doubles_with_remat_at_full_then_fsdp_takes_devices_from_data():
    device = FakeDevice(fixed=10, activations=1200)
    assert device.search().levers == Levers("full", 4, 1, 8)  # 10 + 300 / 4 = 85 MiB
    assert device.tried() == [Levers("none", 1, 1, 8), Levers("save_dots", 1, 1, 8),
                              Levers("full", 1, 1, 8), Levers("full", 2, 1, 8),
                              Levers("full", 4, 1, 8)]
    # Parameters and optimizer state too large for one device: accumulation stops once a
    # doubling gains less than 5%, then fsdp halves the fixed part until it fits.
    device = FakeDevice(fixed=300, activations=40)
    assert device.search().levers == Levers("full", 2, 4, 2)
    assert device.tried()[3:] == [Levers("full", 2, 1, 8), Levers("full", 2, 2, 4),
                                  Levers("full", 2, 4, 2)]


def test_accumulation_stops_where_the_micro_batch_no_longer_splits_over_the_shards():
    device = FakeDevice(fixed=10, activations=1200)
    # 32 rows over 8 shards: at most 4 micro-batches of 8; then fsdp.
    assert device.search(batch_size=32).levers == Levers("full", 4, 1, 8)
    device = FakeDevice(fixed=10, activations=2400)
    with pytest.raises(UserError) as refused:
        device.search(batch_size=32)
    assert Levers("full", 8, 1, 8) not in device.tried()
    assert device.tried()[-1] == Levers("full", 4, 8, 1)  # fsdp over every device, last
    message = str(refused.value)
    assert "\n" not in message and message.startswith(
        "train step at 512 tokens does not fit with any setting train.fit=auto tried (8; the "
        "last, model.remat=full, train.accumulation_steps=4, mesh.fsdp=8, mesh.data=1: train "
        "step at 512 tokens needs 151.2 MiB, over the 90.0 MiB allowed (90% of 100.0 MiB))")


def test_configured_levers_are_floors_and_off_refuses_in_one_line():
    device = FakeDevice(fixed=10, activations=1200)
    fit = device.search(start=Levers("full", 2, 2, 4))
    assert device.tried()[0] == Levers("full", 2, 2, 4)  # no remat step left to try
    assert fit.levers == Levers("full", 4, 2, 4)
    off = FakeDevice(fixed=10, activations=150)
    with pytest.raises(DoesNotFit, match=r"^train step at 512 tokens needs 160\.0 MiB per "
                                         r"device but a device holds 100\.0 MiB \(train\."
                                         r"device_memory_gb\): lower train\.batch_size"):
        off.search(mode="off")
    assert len(off.calls) == 1


def test_a_recorded_setting_is_read_back_and_combined_with_the_configured_one():
    record = memory_fit.search(Levers("none", 1, 1, 8), PHASES,
                               FakeDevice(fixed=10, activations=1200), limit=100 * MiB,
                               batch_size=256).record()
    saved = Levers.from_record(json.loads(json.dumps(record)))
    assert saved == Levers("full", 4, 1, 8)
    assert Levers("save_dots", 8, 2, 4).saving_more(saved) == Levers("full", 8, 2, 4)
    assert Levers.from_record({}) is None
    assert Levers.from_record({"settings": {"model.remat": "most"}}) is None


def test_train_fit_takes_auto_or_off():
    config = tiny.get_config()
    config.train.fit = "on"
    with pytest.raises(UserError, match=r"^train\.fit must be one of auto, off, got 'on'$"):
        pretrain_settings.read(config)


@pytest.mark.slow
def test_a_bad_train_fit_is_refused_before_the_workdir_is_created():
    result = cli_in_process.run("bertjax.cli.main", "--config=configs/tiny.py",
                                "--workdir=/nonexistent/never-created", "--config.train.fit=on")
    assert result.returncode == 2
    assert result.stderr.strip() == ("bertjax: error: train.fit must be one of auto, off, got "
                                     "'on'")
    assert not os.path.exists("/nonexistent/never-created")


# tiny_args' model on the small corpus, per device at its 64-token phase (CHILD_XLA_FLAGS, CPU):
# about 33 MiB as configured, 27 with remat save_dots, 22.6 with full, 18 with full and 2
# micro-batches. With 22.5 MiB (90%: 20.25 allowed) the search takes that last setting.
FITS_AFTER_THREE_LEVERS = {"train.device_memory_gb": 22.5 / 1024}


def logged(workdir):
    return [{k: v for k, v in r.items() if k not in TIMING_FIELDS} for r in read_metrics(workdir)]


@pytest.mark.slow
def test_a_run_whose_phase_did_not_fit_trains_records_the_setting_and_resumes_with_it(
        tmp_path, small_corpus_dir):
    straight = str(tmp_path / "straight")
    result = run_child(tiny_args(straight, small_corpus_dir, **FITS_AFTER_THREE_LEVERS))
    assert result.returncode == 0, result.stderr[-3000:]
    fit_lines = [line for line in result.stderr.splitlines() if line.startswith("fit: ")]
    assert fit_lines[0].startswith("fit: as configured: train step at 64 tokens needs ")
    assert fit_lines[-1].startswith("fit: chose model.remat=full, train.accumulation_steps=2 "
                                    "(train.fit=auto): phase 64 needs ")
    with open(os.path.join(straight, "run.json")) as f:
        record = json.load(f)
    assert record["fit"]["settings"] == {"model.remat": "full", "train.accumulation_steps": 2,
                                         "mesh.fsdp": 1, "mesh.data": 1}
    assert record["fit"]["changed"] == {"model.remat": "full", "train.accumulation_steps": 2}
    assert record["encoder"]["remat"] == "full"
    assert [r["step"] for r in read_metrics(straight) if "loss" in r][-1] == 12

    # Killed once checkpoint 5 is saved, then run again: it takes run.json's setting without
    # searching, and logs and ends exactly as the straight run did.
    resumed = str(tmp_path / "resumed")
    args = tiny_args(resumed, small_corpus_dir, **FITS_AFTER_THREE_LEVERS)
    assert run_child(args, KILL_AFTER_CHECKPOINT=5).returncode == -signal.SIGKILL
    result = run_child(args)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "resuming from step 5" in result.stderr
    fit_lines = [line for line in result.stderr.splitlines() if line.startswith("fit: ")]
    assert fit_lines == ["fit: model.remat=full, train.accumulation_steps=2, as run.json records "
                         "(train.fit=auto keeps a run's setting when it resumes)"]
    with open(os.path.join(resumed, "run.json")) as f:
        assert json.load(f)["fit"]["tried"] == record["fit"]["tried"]
    assert logged(resumed) == logged(straight)
    ours, theirs = (flat(loading.load(w).params) for w in (resumed, straight))
    for name in theirs:
        np.testing.assert_array_equal(ours[name], theirs[name], err_msg=name)


@pytest.mark.tpu_compile
@pytest.mark.slow
def test_bertjax_compile_fits_a_slice_and_says_how_per_phase():
    """configs/tiny.py on a v5e-8 with each chip said to hold 1% less than the configured step
    needs: the report names the setting chosen and, per phase, what it needed."""
    options = types.SimpleNamespace(config="configs/tiny.py", num_slices=1)
    config = tiny.get_config()
    config.schedule.long_fraction = 0.0
    config.schedule.short_seq_len, config.schedule.short_max_predictions = 32, 5
    config.train.batch_size, config.model.dtype = 8, "bfloat16"
    slice_ = topology.parse("v5e-8")
    as_given = compile_cli.run(options, slice_, pretrain_settings.read(config))
    assert as_given["fit"]["changed"] == {} and as_given["fit"]["tried"] == []
    needed = as_given["phases"][0]["memory_bytes"]["total"]
    config.train.device_memory_gb = 0.99 * needed / 2**30
    fitted = compile_cli.run(options, slice_, pretrain_settings.read(config))
    assert fitted["fit"]["changed"], fitted["fit"]
    assert fitted["phases"][0]["memory_bytes"]["total"] <= 0.9 * 0.99 * needed
    line = fitted["fit"]["phases"]["32"]["line"]
    assert line.startswith("as configured: train step at 32 tokens needs ") and "fits with" in line
    assert f"  fit:         {line}" in report.describe(fitted).splitlines()
    settings = fitted["fit"]["settings"]
    assert f"remat={settings['model.remat']}" in fitted["model"]
    assert fitted["mesh"]["fsdp"] == settings["mesh.fsdp"]
