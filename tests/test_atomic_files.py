"""Atomic writes: the old content survives a failed write, the new one gets open()'s mode."""

import json
import os
import stat

import pytest

from bertjax.core import atomic_files


def test_a_failed_write_leaves_the_old_file_and_no_temporary(tmp_path):
    path = tmp_path / "results.json"
    atomic_files.write_json(str(path), {"b": 1, "a": 2}, sort_keys=True)
    assert path.read_text() == '{\n  "a": 2,\n  "b": 1\n}\n'
    with pytest.raises(TypeError):
        atomic_files.write_json(str(path), {"a": object()})
    assert json.loads(path.read_text()) == {"a": 2, "b": 1}
    assert os.listdir(tmp_path) == ["results.json"]


def test_the_file_mode_honours_the_umask(tmp_path):
    old = os.umask(0o027)
    try:
        atomic_files.write_text(str(tmp_path / "a.txt"), "x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(tmp_path / "a.txt").st_mode) == 0o640
