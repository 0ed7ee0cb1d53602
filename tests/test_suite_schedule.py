"""The suite's own schedule (tests/suite_schedule.py): the files it ranks exist, and the ranking
moves whole files while keeping each file's tests in order."""

import pathlib
from types import SimpleNamespace

import suite_schedule

TESTS = pathlib.Path(suite_schedule.TESTS)


def test_every_ranked_file_exists_once():
    ranked = suite_schedule.LONGEST_FIRST
    assert len(set(ranked)) == len(ranked)
    missing = [name for name in ranked if not (TESTS / name).is_file()]
    assert not missing, f"renamed or removed: {missing}"


def test_ranked_files_go_first_and_each_file_keeps_its_order():
    first, second = suite_schedule.LONGEST_FIRST[:2]
    items = [SimpleNamespace(path=TESTS / name, name=f"{name}:{n}") for name, n in
             [("test_configs.py", 1), (second, 1), ("test_configs.py", 2), (first, 1),
              (second, 2), ("faults/test_inputs.py", 1), (first, 2)]]
    suite_schedule.longest_first(items)
    assert [item.name for item in items] == [
        f"{first}:1", f"{first}:2", f"{second}:1", f"{second}:2", "test_configs.py:1",
        "test_configs.py:2", "faults/test_inputs.py:1"]


def test_make_test_keeps_the_collection_order():
    makefile = (TESTS.parent / "Makefile").read_text()
    assert "--dist loadfile --no-loadscope-reorder" in makefile, (
        "without it xdist orders files by their number of tests, not as ranked")
