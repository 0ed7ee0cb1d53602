"""`python -m bertjax.compile --json OUT` writes its report as every command writes an output
(bertjax.core.output_dir): refused before the compile when it exists (without --overwrite), is a
directory, lies in a missing directory, or is the config itself; replaced only when it is a
report; staged, so a failed compile leaves nothing; and on gs:// too.

The refusals come before libtpu is needed; the writes compile a tiny step (full tier)."""

import hashlib
import json
import os

import pytest

import cli_in_process
from bertjax.core import storage

# The smallest step (tests/test_compile.py's): configs/tiny.py, one phase of 32 tokens, 8 rows.
SMALL = ["--config=configs/tiny.py", "--topology=v5e-8", "--config.schedule.long_fraction=0",
         "--config.schedule.short_seq_len=32", "--config.schedule.short_max_predictions=5",
         "--config.train.batch_size=8"]


def compile_(*args):
    return cli_in_process.run("bertjax.cli.compile", *args)


def one_line(result, *phrases):
    assert result.returncode == 2, result.stderr
    line, = result.stderr.strip().splitlines()
    assert line.startswith("bertjax: error:"), line
    for phrase in phrases:
        assert phrase in line, line


def md5(path) -> str:
    return hashlib.md5(open(path, "rb").read()).hexdigest()


def test_an_existing_file_is_refused_before_the_compile(tmp_path):
    out = tmp_path / "report.json"
    out.write_text('{"mine": 1}\n')
    before = md5(out)
    one_line(compile_(*SMALL, f"--json={out}"), "already exists", "--overwrite")
    assert md5(out) == before


def test_overwrite_replaces_only_a_report(tmp_path):
    out = tmp_path / "notes.json"
    out.write_text('{"mine": 1}\n')
    one_line(compile_(*SMALL, f"--json={out}", "--overwrite"), "is not a bertjax.compile report")
    assert json.loads(out.read_text()) == {"mine": 1}


@pytest.mark.parametrize("target, phrase", [
    ("", "already exists"),                        # the directory itself
    ("missing/report.json", "is not an existing directory"),
])
def test_a_directory_or_a_missing_parent_is_refused(tmp_path, target, phrase):
    one_line(compile_(*SMALL, f"--json={tmp_path / target}"), phrase)
    assert not (tmp_path / "missing").exists()


def test_the_config_file_is_never_the_output(tmp_path):
    config = tmp_path / "config.py"
    config.write_text(open("configs/tiny.py").read())
    before = md5(config)
    args = [f"--config={config}", *SMALL[1:], f"--json={config}", "--overwrite"]
    one_line(compile_(*args), "would replace the input")
    assert md5(config) == before


def test_overwrite_without_json_is_refused():
    one_line(compile_(*SMALL, "--overwrite"), "--overwrite replaces the --json report")


@pytest.mark.tpu_compile
def test_the_report_is_written_and_replaced_by_overwrite(tmp_path):
    out = tmp_path / "report.json"
    assert compile_(*SMALL, f"--json={out}").returncode == 0
    first = json.loads(out.read_text())
    assert first["topology"] == "v5e-8" and first["phases"][0]["seq_len"] == 32
    result = compile_(*SMALL, "--config.train.batch_size=16", f"--json={out}", "--overwrite")
    assert result.returncode == 0, result.stderr
    assert json.loads(out.read_text())["phases"][0]["batch"] == 16
    assert [p.name for p in tmp_path.iterdir()] == ["report.json"]  # no staging copy left


@pytest.mark.tpu_compile
def test_a_compile_that_fails_leaves_no_report(tmp_path):
    out = tmp_path / "report.json"
    result = compile_(*SMALL, "--config.train.batch_size=4194304", f"--json={out}",
                      "--config.train.fit=off")
    one_line(result, "GiB per device")
    assert list(tmp_path.iterdir()) == []


@pytest.mark.tpu_compile
@pytest.mark.gcs
def test_the_report_goes_to_a_bucket(gcs):
    url = f"gs://{gcs.new_bucket('compile')}/reports/v5e.json"
    assert compile_(*SMALL, f"--json={url}").returncode == 0
    assert json.loads(storage.read_bytes(url))["chips"] == 8
    one_line(compile_(*SMALL, f"--json={url}"), "already exists")
    assert os.environ["STORAGE_EMULATOR_HOST"]  # the suite's server, not Google's
