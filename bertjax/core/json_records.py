"""JSON records (manifests, run.json, config.json, index descriptions): a file read as one JSON
object, or the reason it is not one, for the caller to put into its own one-line refusal."""

from __future__ import annotations

import json


class NotAnObject(ValueError):
    """The file is not readable JSON, or holds something other than an object; the message is
    the reason, to follow the file's name: "is not readable JSON (...)", "holds a list, not an
    object"."""


def read_object(path: str) -> dict:
    """The JSON object in `path`; NotAnObject otherwise (a missing file included)."""
    try:
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as e:
        raise NotAnObject(f"is not readable JSON ({e})") from None
    if not isinstance(value, dict):
        raise NotAnObject(f"holds {kind_of(value)}, not an object")
    return value


def kind_of(value) -> str:
    """What a JSON value is, for messages: "a list", "an integer (123)"."""
    if value is None:
        return "null"
    for kind, words in ((bool, "true/false"), (int, "an integer"), (float, "a number"),
                        (str, "a string"), (list, "a list"), (dict, "an object")):
        if isinstance(value, kind):
            return f"{words} ({json.dumps(value)[:40]})" if kind in (int, float, str) else words
    return type(value).__name__
