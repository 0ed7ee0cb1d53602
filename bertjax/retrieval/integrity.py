"""Whether the files of an index on disk are the ones its JSON record describes.

A record names, for each file, its size in bytes and its sha256 digest (`file_record`); checking
the sizes costs a stat per file, checking the digests a read of each file. What is wrong is
raised as `Damage`, in words that name the file or the key: the caller knows which index it is
and how to rebuild it, so it turns a Damage into its one-line UserError.

`schema_problem` checks a JSON record against a schema written as plain values: a type (an int
must not be a bool), None (JSON null), a dict (an object with these keys), a one-item list (a
list whose items match it) or a tuple (any one of these).
"""

from __future__ import annotations

import hashlib
import os

from bertjax.core import json_records

DIGEST_BLOCK = 1 << 20  # bytes hashed per read: a large vectors file streams through
FILE_RECORD = {"bytes": int, "sha256": str}


class Damage(Exception):
    """What is wrong with an index's files, in words (the caller names the index)."""


def sha256_of(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(DIGEST_BLOCK):
            digest.update(block)
    return digest.hexdigest()


def file_record(path: str) -> dict:
    return {"bytes": os.path.getsize(path), "sha256": sha256_of(path)}


def check_sizes(directory: str, records: dict) -> None:
    """Each file of `records` ({name: file record}) exists in `directory` with its size."""
    for name, record in records.items():
        path = os.path.join(directory, name)
        if not os.path.isfile(path):
            raise Damage(f"{name} is missing")
        size = os.path.getsize(path)
        if size != record["bytes"]:
            raise Damage(f"{name} has {size} bytes, the manifest records {record['bytes']} "
                         "(truncated or replaced)")


def check_digests(directory: str, records: dict) -> None:
    """Each file of `records` hashes to its recorded sha256 (sizes checked first: cheaper)."""
    check_sizes(directory, records)
    for name, record in records.items():
        try:
            found = sha256_of(os.path.join(directory, name))
        except OSError as e:
            raise Damage(f"{name} is unreadable ({e})") from None
        if found != record["sha256"]:
            raise Damage(f"{name} is not the file the index was built with (its sha256 differs "
                         "from the manifest's)")


def read_json_object(path: str) -> dict:
    """The JSON object in `path` (which exists); anything else is Damage."""
    try:
        return json_records.read_object(path)
    except json_records.NotAnObject as e:
        raise Damage(f"{os.path.basename(path)} {e}") from None


def check_schema(record: dict, schema: dict, file_name: str) -> None:
    """Raises Damage naming the first key of `record` missing or of the wrong type."""
    problem = schema_problem(record, schema)
    if problem is not None:
        raise Damage(f"{file_name} {problem}")


def schema_problem(value, expected, name: str = "") -> str | None:
    """What is wrong with `value` against the schema `expected`, naming the key; None if it
    matches."""
    if isinstance(expected, dict):
        if not isinstance(value, dict):
            return _wrong(name, value, expected)
        for key, wanted in expected.items():
            where = f"{name}.{key}" if name else key
            if key not in value:
                return f"has no key {where!r}"
            problem = schema_problem(value[key], wanted, where)
            if problem is not None:
                return problem
        return None
    if isinstance(expected, list):
        if not isinstance(value, list):
            return _wrong(name, value, expected)
        for i, item in enumerate(value):
            problem = schema_problem(item, expected[0], f"{name}[{i}]")
            if problem is not None:
                return problem
        return None
    if isinstance(expected, tuple):
        if any(schema_problem(value, option, name) is None for option in expected):
            return None
        return _wrong(name, value, expected)
    return None if _is(value, expected) else _wrong(name, value, expected)


def _is(value, expected) -> bool:
    if expected is None:
        return value is None
    if isinstance(value, bool):  # JSON true is not a count
        return expected is bool
    if expected is float:
        return isinstance(value, (int, float))
    return isinstance(value, expected)


def _wrong(name: str, value, expected) -> str:
    return f"has {name!r} as {json_records.kind_of(value)}, not {_describe(expected)}"


def _describe(expected) -> str:
    if isinstance(expected, tuple):
        return " or ".join(_describe(option) for option in expected)
    if isinstance(expected, dict):
        return "an object"
    if isinstance(expected, list):
        return "a list"
    names = {None: "null", bool: "true/false", int: "an integer", float: "a number",
             str: "a string"}
    return names[expected] if expected in names else expected.__name__
