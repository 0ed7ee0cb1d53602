"""bertjax.core.host_memory: the entry points re-execute themselves once with glibc's huge-page
tunable, unless opted out, already set, or not applicable."""

import os
import subprocess
import sys

import pytest

from bertjax.core import host_memory

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@pytest.fixture
def applicable(monkeypatch):
    monkeypatch.setattr(host_memory, "glibc_version", lambda: (2, 36))
    monkeypatch.setattr(host_memory, "transparent_huge_pages_available", lambda: True)
    monkeypatch.setattr(sys, "platform", "linux")


def test_the_tunable_is_added_to_what_is_set(applicable):
    assert host_memory.tunables_with_huge_pages({}) == "glibc.malloc.hugetlb=1"
    assert (host_memory.tunables_with_huge_pages({"GLIBC_TUNABLES": "glibc.malloc.arena_max=2"})
            == "glibc.malloc.arena_max=2:glibc.malloc.hugetlb=1")


def test_nothing_is_changed_when_set_opted_out_or_unsupported(applicable, monkeypatch):
    assert host_memory.tunables_with_huge_pages(
        {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=0"}) is None
    assert host_memory.tunables_with_huge_pages({"BERTJAX_HUGE_PAGES": "0"}) is None
    monkeypatch.setattr(host_memory, "glibc_version", lambda: (2, 31))
    assert host_memory.tunables_with_huge_pages({}) is None
    monkeypatch.setattr(host_memory, "glibc_version", lambda: None)  # musl, macOS
    assert host_memory.tunables_with_huge_pages({}) is None


def test_no_transparent_huge_pages_means_no_change(monkeypatch, tmp_path):
    setting = tmp_path / "enabled"
    setting.write_text("always madvise [never]\n")
    monkeypatch.setattr(host_memory, "THP_SETTING", str(setting))
    assert not host_memory.transparent_huge_pages_available()
    setting.write_text("always [madvise] never\n")
    assert host_memory.transparent_huge_pages_available()


def run_entry_point(**env_changes) -> str:
    env = {k: v for k, v in os.environ.items() if k not in ("GLIBC_TUNABLES", "BERTJAX_HUGE_PAGES")}
    env.update(env_changes, PYTHONPATH=REPO)
    done = subprocess.run([sys.executable, "-m", "bertjax.core.host_memory"], env=env, cwd=REPO,
                          capture_output=True, text=True, timeout=60, check=True)
    return done.stdout.strip()


def test_an_entry_point_runs_with_the_tunable_after_reexecuting_itself():
    expected = host_memory.tunables_with_huge_pages({})
    # This machine (Linux, glibc >= 2.35, THP not "never") is one where it applies; elsewhere
    # the process must run unchanged.
    if expected is None:
        assert run_entry_point() == "GLIBC_TUNABLES="
    else:
        assert run_entry_point() == "GLIBC_TUNABLES=glibc.malloc.hugetlb=1"
    assert run_entry_point(BERTJAX_HUGE_PAGES="0") == "GLIBC_TUNABLES="
    assert (run_entry_point(GLIBC_TUNABLES="glibc.malloc.hugetlb=0")
            == "GLIBC_TUNABLES=glibc.malloc.hugetlb=0")
