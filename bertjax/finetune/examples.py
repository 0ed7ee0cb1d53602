"""The plain examples fine-tuning reads, whatever their source, and how a packaged dataset's
examples are split.

Readers (`readers`, `conll`, `squad`, the packaged datasets) return these; tasks turn them into
features. Labels stay strings here (numbers for regression); the task maps them to ids.

A packaged dataset (`packaged:NAME:SPLIT`) is split into train (80%), dev (10%) and test (10%)
by a CRC-32 of each example's text (of its article's title for Wikipedia pairs): the split never
depends on file order or on the Python hash seed, and duplicated texts always fall in the same
split, so no dev sentence is also a training sentence.
"""

from __future__ import annotations

import dataclasses
import zlib

PACKAGED_PREFIX = "packaged:"
SPLITS = {"train": range(0, 8), "dev": range(8, 9), "test": range(9, 10)}


@dataclasses.dataclass
class TextExample:
    id: str
    text: str
    text_pair: str | None = None
    label: str | float | None = None
    negative: str | None = None  # retrieval: a hard negative document


@dataclasses.dataclass
class TaggedExample:
    id: str
    words: list[str]
    tags: list[str] | None = None


@dataclasses.dataclass
class SpanExample:
    """A span of `text`, characters [start, end), and its label."""

    id: str
    text: str
    start: int
    end: int
    label: str | None = None


@dataclasses.dataclass
class QAExample:
    id: str
    question: str
    context: str
    answers: list[tuple[str, int]]  # (text, character offset in the context)


def split_of(text: str) -> str:
    """The packaged split ("train", "dev" or "test") that `text` falls in."""
    bucket = zlib.crc32(text.encode("utf-8")) % 10
    return next(name for name, buckets in SPLITS.items() if bucket in buckets)
