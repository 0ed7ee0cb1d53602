"""Reading a config strictly: every key a job reads is declared in its config file (configs/base.py
and configs/finetune_base.py declare them all, with their defaults), so a key the config lacks is
refused by its dotted name rather than filled in with a second, hidden default."""

from __future__ import annotations

import dataclasses
import math

import ml_collections

from bertjax.core.errors import UserError


class Section:
    """A config (or one of its sections) read by `section.key` or `section["key"]`; a missing key
    is one UserError naming it, a subsection is a Section too."""

    def __init__(self, values: ml_collections.ConfigDict, prefix: str = ""):
        self._values = values
        self._prefix = prefix  # the dotted path of this section ("" or "data.")

    def __getattr__(self, key: str):
        if key.startswith("_"):  # not a config key: copy and pickle probe for these
            raise AttributeError(key)
        return self[key]

    def __getitem__(self, key: str):
        name = self._prefix + key
        if key not in self._values:
            raise UserError(f"the config has no {name}: a config file declares every key its job "
                            "reads (start from configs/base.py or configs/finetune_base.py)")
        value = self._values[key]
        if isinstance(value, ml_collections.ConfigDict):
            return Section(value, name + ".")
        _check_number(name, value)
        return value

    def __contains__(self, key: str) -> bool:
        return key in self._values

    def keys(self) -> list[str]:
        return list(self._values.keys())


# JAX counts steps, sizes and seeds in 32-bit integers: a larger count would wrap around (a step
# counter) or ask for an array no device holds.
LARGEST_INT = 2**31 - 1


def _check_number(name: str, value) -> None:
    """No setting means infinity or NaN: an inf weight or temperature would train, then diverge
    and be reported as a learning-rate problem; nor is any integer beyond LARGEST_INT. Refused
    here, where every setting is read."""
    values = value if isinstance(value, (tuple, list)) else (value,)
    for item in values:
        if isinstance(item, float) and not math.isfinite(item):
            raise UserError(f"{name} must be a finite number, got {value}")
        if isinstance(item, int) and not isinstance(item, bool) and abs(item) > LARGEST_INT:
            raise UserError(f"{name} must be at most {LARGEST_INT} (JAX counts in 32-bit "
                            f"integers), got {value}")


def strict(config: ml_collections.ConfigDict | Section) -> Section:
    return config if isinstance(config, Section) else Section(config)


def fields_of(cls, section: Section, prefix: str, skip=(), beside=()) -> dict:
    """The section's values for `cls`'s fields but `skip`: one of them the section lacks, or a
    key that is neither a field nor `beside` (keys read elsewhere), is refused by name."""
    names = [f.name for f in dataclasses.fields(cls) if f.name not in skip]
    unknown = sorted(set(section.keys()) - set(names) - set(beside))
    if unknown:
        raise UserError(f"unknown setting(s) {', '.join(prefix + '.' + k for k in unknown)}")
    return {name: section[name] for name in names}
