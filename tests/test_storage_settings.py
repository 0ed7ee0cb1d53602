"""BERTJAX_STORAGE_TIMEOUT bounds every storage call: a value that bounds nothing (nan, inf, zero
or less) or is not a number is refused in one line, whatever the path."""

import pytest

from bertjax.core import storage
from bertjax.core.errors import UserError


@pytest.mark.parametrize("raw", ["nan", "inf", "-inf", "0", "-1", "ten"])
def test_a_timeout_that_bounds_nothing_is_refused(raw, monkeypatch):
    monkeypatch.setenv("BERTJAX_STORAGE_TIMEOUT", raw)
    with pytest.raises(UserError, match=rf"^BERTJAX_STORAGE_TIMEOUT='{raw}' must be a positive, "
                                        "finite number of seconds$"):
        storage.timeout_seconds()


def test_a_timeout_is_read_in_seconds_and_unset_is_the_default(monkeypatch):
    monkeypatch.setenv("BERTJAX_STORAGE_TIMEOUT", "2.5")
    assert storage.timeout_seconds() == 2.5
    monkeypatch.delenv("BERTJAX_STORAGE_TIMEOUT")
    assert storage.timeout_seconds() == storage.DEFAULT_TIMEOUT_S
