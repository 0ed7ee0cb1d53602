"""faults/file_trees.py, the catalog's witness that nothing changed: a rewrite of the same size is
seen at once, and a file nothing touched is not read again."""

import builtins
import time

from faults import file_trees


def test_an_md5_is_reused_only_while_the_file_is_untouched(tmp_path, monkeypatch):
    a, b = str(tmp_path / "a"), str(tmp_path / "b")
    (tmp_path / "a").write_bytes(b"one")
    (tmp_path / "b").write_bytes(b"two")
    opened = []
    real_open = builtins.open
    monkeypatch.setattr(builtins, "open", lambda path, *args, **kwargs: opened.append(path) or
                        real_open(path, *args, **kwargs))
    fresh = file_trees.md5s(str(tmp_path))
    assert file_trees.md5s(str(tmp_path)) == fresh
    assert opened == [a, b, a, b]  # just written: read each time, not remembered
    time.sleep(file_trees.SETTLED_SECONDS + 0.1)
    opened.clear()
    assert file_trees.md5s(str(tmp_path)) == fresh and opened == [a, b]  # settled: remembered now
    opened.clear()
    with real_open(b, "wb") as f:  # the same size, at once
        f.write(b"TWO")
    again = file_trees.md5s(str(tmp_path))
    assert again["a"] == fresh["a"] and again["b"] != fresh["b"]
    assert opened == [b]  # only the rewritten file was read
