"""What the Python API (`bertjax.load`, `Model`) accepts, checked before anything is read or run.

A wrong type raises `ArgumentTypeError`, a `TypeError` that is also a `UserError` (so a command
wrapped in `exit_on_user_error` still reports it as one line); a value of the right type that
cannot be used raises `UserError`. Every message starts with the function and names the argument:
"embed: texts[1] must be a string, got int".

The one rule for lone strings: the parameters that hold a list (texts, pairs, a, b, sentences)
refuse a string, which would otherwise be iterated character by character. `fill_mask`'s `text`
is the one parameter that names a single text; it takes a string, or a list of them.
"""

from __future__ import annotations

import numbers
import os
from collections.abc import Iterable, Mapping

import numpy as np
from jax.sharding import Mesh

from bertjax.core.errors import UserError, check_int
from bertjax.finetune.examples import QAExample, SpanExample, TaggedExample, TextExample
from bertjax.finetune.readers import check_span
from bertjax.model.config import DTYPES
from bertjax.model.pooling import POOLINGS
from bertjax.vectors.standardizer import Standardizer

MASK = "[MASK]"
LAYERS_EXPECTED = "'all', an index or a list of indices"


class ArgumentTypeError(UserError, TypeError):
    """An argument of the wrong type: a TypeError, and a UserError like any other bad input."""


def _type_name(value) -> str:
    return type(value).__name__


def _shown(value) -> str:
    shown = repr(value)
    return shown if len(shown) <= 60 else shown[:57] + "..."


def _is_integer(value) -> bool:
    # numpy's integers count; bool is an int to Python but never meant as one here.
    return isinstance(value, numbers.Integral) and not isinstance(value, (bool, np.bool_))


def _items(where: str, name: str, value, expected: str) -> list:
    """`value` as a list, if it is a collection of items (not a string or a mapping)."""
    if isinstance(value, str):
        raise ArgumentTypeError(f"{where}: {name} must be {expected}, got one string "
                                f"{_shown(value)}; for one item, pass [{_shown(value)}]")
    if isinstance(value, (bytes, Mapping)) or not isinstance(value, Iterable):
        raise ArgumentTypeError(f"{where}: {name} must be {expected}, got {_type_name(value)}")
    return list(value)


def texts(where: str, value, name: str = "texts") -> list[str]:
    """A list of strings (an empty list included)."""
    items = _items(where, name, value, "a list of texts (strings)")
    for index, item in enumerate(items):
        if not isinstance(item, str):
            raise ArgumentTypeError(f"{where}: {name}[{index}] must be a string, got "
                                    f"{_type_name(item)}")
    return items


def pairs(where: str, value, count: int) -> list[str] | None:
    """None, or one second text for each of the `count` texts."""
    if value is None:
        return None
    seconds = texts(where, value, "pairs")
    if len(seconds) != count:
        raise UserError(f"{where}: pairs must be as many as the texts: {count} texts but "
                        f"{len(seconds)} pairs")
    return seconds


def sentences(where: str, value) -> list[list[str]]:
    """Sentences as lists of words. A sentence given as one string is refused, not split: how
    it splits into words decides which vectors come back, so the caller says it."""
    items = _items(where, "sentences", value, "a list of sentences, each a list of words")
    for index, sentence in enumerate(items):
        if isinstance(sentence, str):
            raise ArgumentTypeError(f"{where}: sentences[{index}] must be a list of words, got "
                                    f"the string {_shown(sentence)}; split it first, e.g. "
                                    "sentence.split()")
        items[index] = words = _items(where, f"sentences[{index}]", sentence, "a list of words")
        for position, word in enumerate(words):
            if not isinstance(word, str):
                raise ArgumentTypeError(f"{where}: sentences[{index}][{position}] must be a "
                                        f"string, got {_type_name(word)}")
            if not word.strip():
                raise UserError(f"{where}: sentences[{index}][{position}] is a blank word")
    return items


def masked_texts(where: str, value) -> list[str]:
    """`fill_mask`'s text: one string or a list of them, each with at least one [MASK]."""
    if isinstance(value, (bytes, Mapping)) or not isinstance(value, Iterable):
        raise ArgumentTypeError(f"{where}: text must be a string or a list of strings, got "
                                f"{_type_name(value)}")
    given = [value] if isinstance(value, str) else texts(where, value, "text")
    for index, text in enumerate(given):
        if MASK not in text:
            name = "text" if isinstance(value, str) else f"text[{index}]"
            raise UserError(f"{where}: {name} has no {MASK} to fill: {_shown(text)}")
    return given


def layer_indices(where: str, layers, num_layers: int) -> tuple[int, ...]:
    """'all', one index or a list of them (negative from the end) -> indices into the
    num_layers + 1 hidden states (0 = the embeddings' output)."""
    count = num_layers + 1
    if isinstance(layers, str):
        if layers != "all":
            raise UserError(f"{where}: layers={layers!r}: give {LAYERS_EXPECTED}")
        return tuple(range(count))
    chosen = [layers] if _is_integer(layers) else _items(where, "layers", layers, LAYERS_EXPECTED)
    if not chosen:
        raise UserError(f"{where}: layers: choose at least one layer")
    for index in chosen:
        if not _is_integer(index):
            raise ArgumentTypeError(f"{where}: layers must be {LAYERS_EXPECTED}, got "
                                    f"{_shown(index)} ({_type_name(index)})")
        if not -count <= index < count:
            raise UserError(f"{where}: layer {index} does not exist: the model has {count} hidden "
                            f"states (0 = embeddings .. {count - 1} = last layer)")
    return tuple(int(index) % count for index in chosen)


def choice(where: str, name: str, value, choices: tuple[str, ...]) -> str:
    if not isinstance(value, str):
        raise ArgumentTypeError(f"{where}: {name} must be one of {', '.join(choices)}, got "
                                f"{_type_name(value)}")
    if value not in choices:
        raise UserError(f"{where}: unknown {name} {value!r}; choose one of {', '.join(choices)}")
    return value


def pooling(where: str, value) -> str:
    return choice(where, "pooling", value, POOLINGS)


def flag(where: str, name: str, value) -> bool:
    if not isinstance(value, (bool, np.bool_)):
        raise ArgumentTypeError(f"{where}: {name} must be True or False, got {_shown(value)}")
    return bool(value)


def integer(where: str, name: str, value, minimum: int, *, optional: bool = False) -> int | None:
    if value is None and optional:
        return None
    if not _is_integer(value):
        raise ArgumentTypeError(f"{where}: {name} must be an integer of at least {minimum}"
                                f"{' (or None)' if optional else ''}, got {_shown(value)}")
    check_int(f"{where}: {name}", value, minimum)
    return int(value)


def path(where: str, name: str, value, *, optional: bool = False) -> str | None:
    if value is None and optional:
        return None
    if not isinstance(value, (str, os.PathLike)):
        raise ArgumentTypeError(f"{where}: {name} must be a path (str or os.PathLike), got "
                                f"{_type_name(value)}")
    if not os.fspath(value):
        raise UserError(f"{where}: {name} is empty; give a model's path")
    return os.fspath(value)


def standardize(where: str, value):
    """None, a Standardizer, or the path of its statistics file (read by the caller)."""
    if value is None or isinstance(value, Standardizer):
        return value
    return path(where, "standardize", value)


def model_options(where: str, batch_size, max_seq_len, mesh, dtype) -> None:
    """How a model runs: rows per batch, the longest input, the devices and the compute dtype."""
    integer(where, "batch_size", batch_size, 1)
    integer(where, "max_seq_len", max_seq_len, 3, optional=True)
    if mesh is not None and not isinstance(mesh, Mesh):
        raise ArgumentTypeError(f"{where}: mesh must be a jax.sharding.Mesh (see "
                                f"bertjax.parallel.mesh.make_mesh) or None, got {_type_name(mesh)}")
    if dtype is not None:
        choice(where, "dtype", dtype, DTYPES)


def task_examples(where: str, kind: str, given, contexts) -> list:
    """`predict`'s texts (and pairs) as the examples of a task of `kind`."""
    if kind in ("span", "tagged") and contexts is not None:
        raise UserError(f"{where}: pairs are for sentence-pair and QA tasks; a {kind} task "
                        "takes none")
    if kind == "span":
        return [_span_example(where, index, item)
                for index, item in enumerate(_items(where, "texts", given, "a list of (text, "
                                                    "start, end) spans"))]
    if kind == "tagged":
        items = _items(where, "texts", given, "a list of texts or of word lists")
        return [TaggedExample(str(index), _tagged_words(where, index, item))
                for index, item in enumerate(items)]
    questions = texts(where, given)
    seconds = pairs(where, contexts, len(questions))
    if kind == "qa":
        if seconds is None:
            raise UserError(f"{where}: QA predictions need the contexts: "
                            "predict(questions, pairs=contexts)")
        return [QAExample(id=str(index), question=question, context=context, answers=[])
                for index, (question, context) in enumerate(zip(questions, seconds))]
    return [TextExample(str(index), text, seconds[index] if seconds is not None else None)
            for index, text in enumerate(questions)]


def _tagged_words(where: str, index: int, item) -> list[str]:
    """A text to tag: a string (split on whitespace, as predict mode reads it) or its words."""
    if isinstance(item, str):
        return item.split()
    words = _items(where, f"texts[{index}]", item, "a text or a list of words")
    for position, word in enumerate(words):
        if not isinstance(word, str):
            raise ArgumentTypeError(f"{where}: texts[{index}][{position}] must be a string, got "
                                    f"{_type_name(word)}")
    return words


def _span_example(where: str, index: int, given) -> SpanExample:
    try:
        text, start, end = given
    except (TypeError, ValueError):
        raise ArgumentTypeError(f"{where}: texts[{index}] must be a (text, start, end) span, got "
                                f"{_shown(given)}") from None
    if not isinstance(text, str) or not all(_is_integer(offset) for offset in (start, end)):
        raise ArgumentTypeError(f"{where}: texts[{index}] must be a (text, start, end) span with "
                                f"integer offsets, got {_shown(given)}")
    check_span(text, int(start), int(end), f"{where}: span {index}")
    return SpanExample(str(index), text, int(start), int(end))
