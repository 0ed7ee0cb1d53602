"""faults/file_trees.py, the catalog's witness that nothing changed: a rewrite of the same size is
seen at once, and a file nothing touched is not read again."""

import builtins
import time

from faults import file_trees


def test_an_md5_is_reused_only_while_the_file_is_untouched(tmp_path, monkeypatch):
    (tmp_path / "a").write_bytes(b"one")
    (tmp_path / "b").write_bytes(b"two")
    fresh = file_trees.md5s(str(tmp_path))
    assert fresh == file_trees.md5s(str(tmp_path))  # just written: read again, not remembered
    time.sleep(file_trees.SETTLED_SECONDS + 0.1)
    assert file_trees.md5s(str(tmp_path)) == fresh  # settled: remembered now
    opened = []
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda path, *a, **k: opened.append(path) or
                        real_open(path, *a, **k))
    (tmp_path / "b").write_bytes(b"TWO")  # the same size, at once
    again = file_trees.md5s(str(tmp_path))
    assert again["a"] == fresh["a"] and again["b"] != fresh["b"]
    assert opened[-1:] == [str(tmp_path / "b")]  # only the rewritten file was read
