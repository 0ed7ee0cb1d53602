"""A URL that names no bucket (`gs://`, `gs:///x`, `s3://`) is refused in one line before any
request, wherever a command takes a URL: a workdir, an output, an input."""

import os

import pytest

import cli_in_process
from bertjax.core import storage
from bertjax.core.errors import UserError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.mark.parametrize("url", ["gs://", "gs:///x", "gcs://", "s3:///data"])
def test_no_bucket_is_refused_by_name(url):
    with pytest.raises(UserError, match=rf"^{url} names no bucket: write "):
        storage.bucket(url)
    with pytest.raises(UserError, match=rf"^{url} names no bucket"):
        storage.filesystem(url)


def test_a_trailing_slash_goes_but_never_the_schemes():
    assert storage.absolute("gs://b/run/") == "gs://b/run"
    assert storage.absolute("gs://") == "gs://"


@pytest.mark.parametrize("command, args", [
    ("main", ["--config=configs/tiny.py", "--workdir=gs://"]),
    ("main", ["--config=configs/tiny.py", "--workdir=gs:///x"]),
    ("data.prepare", ["--input=README.md", "--output=gs:///x", "--train-vocab=wordpiece"]),
])
def test_commands_refuse_it_in_one_line(command, args):
    before = sorted(os.listdir(REPO))
    result = cli_in_process.run(command, *args)
    assert result.returncode == 2, result.stderr
    line, = result.stderr.strip().splitlines()
    assert line.startswith("bertjax: error: gs:") and "names no bucket" in line, line
    assert sorted(os.listdir(REPO)) == before  # no local "gs:" folder, nothing else written
