"""Documents from raw text: files, directories, globs (.gz/.bz2 read transparently) and TFDS.

A document is a list of sentence strings. Sources stream: memory stays bounded however large the
corpus, and the order is deterministic (inputs as given, each expanded in sorted order).

Input formats (for files; a `tfds:NAME[:SPLIT]` input is always read through TFDS):
  sentences   google-research/bert's layout: one sentence a line, a blank line between documents.
  paragraphs  one paragraph a line, split into sentences by `split_sentences`; a blank line ends a
              document.
  mediawiki   a MediaWiki XML dump; each namespace-0 article that is not a redirect is a document.
In every format the end of a file ends a document, and a document longer than
MAX_DOCUMENT_SENTENCES is cut there (counted), so one file without blank lines cannot fill memory.

Bad input: a missing path, a binary file and an empty corpus raise `UserError`; a line that is
not valid UTF-8 or is longer than `max_line_chars` is skipped and counted in `SourceStats`.
"""

from __future__ import annotations

import bz2
import collections
import dataclasses
import glob
import gzip
import io
import os
import re
from typing import BinaryIO, Iterator, Sequence, TextIO

from bertjax.core import extras
from bertjax.data import wikitext
from bertjax.data.sentence_splitting import split_sentences
from bertjax.core.errors import UserError, check_choice

FORMATS = ("sentences", "paragraphs", "mediawiki")
TFDS_PREFIX = "tfds:"
DEFAULT_MAX_LINE_CHARS = 1_000_000
MAX_DOCUMENT_SENTENCES = 100_000
_SNIFF_BYTES = 8192
_TFDS_BATCH = 256
# Undecodable bytes come back as lone surrogates under errors="surrogateescape".
_UNDECODABLE = re.compile("[\udc80-\udcff]")
_TFDS_VERSION = re.compile(r"\d+\.\d+\.\d+")


@dataclasses.dataclass
class SourceStats:
    """What a pass over the sources saw; preparation stores it in the manifest."""

    documents: int = 0
    sentences: int = 0
    skipped_lines: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    skipped_pages: collections.Counter = dataclasses.field(default_factory=collections.Counter)
    cut_documents: int = 0

    def to_json(self) -> dict:
        return {"documents": self.documents, "sentences": self.sentences,
                "skipped_lines": dict(sorted(self.skipped_lines.items())),
                "skipped_pages": dict(sorted(self.skipped_pages.items())),
                "cut_documents": self.cut_documents}

    def add(self, other: "SourceStats") -> None:
        """Counts `other` in too: the stats of several inputs read apart, as one pass's."""
        self.documents += other.documents
        self.sentences += other.sentences
        self.skipped_lines.update(other.skipped_lines)
        self.skipped_pages.update(other.skipped_pages)
        self.cut_documents += other.cut_documents


def is_tfds(spec: str) -> bool:
    return spec.startswith(TFDS_PREFIX)


def resolve_inputs(inputs: Sequence[str]) -> list[str]:
    """Files (and `tfds:` specs) the inputs name, in reading order; UserError for missing ones.

    A directory stands for every file below it (sorted, recursively; hidden files are left out);
    a glob for its sorted matches (`**` recurses). A file named twice is read once.
    """
    if isinstance(inputs, str):
        raise UserError(f"inputs must be a list of files, directories or globs, not the string "
                        f"{inputs!r}")
    if not inputs:
        raise UserError("no input given: pass a list of files, directories or globs")
    resolved: list[str] = []
    for spec in inputs:
        if is_tfds(spec):
            resolved.append(spec)
        elif glob.has_magic(spec):
            matches = sorted(glob.glob(spec, recursive=True))
            if not matches:
                raise UserError(f"no file matches {spec}")
            for match in matches:
                resolved.extend(_files_under(match))
        elif os.path.isdir(spec):
            resolved.extend(_files_under(spec))
        elif os.path.isfile(spec):
            resolved.append(spec)
        else:
            raise UserError(f"input not found: {spec}")
    if not resolved:
        raise UserError(f"the inputs {', '.join(inputs)} hold no files")
    return list(dict.fromkeys(resolved))


def _files_under(path: str) -> list[str]:
    if not os.path.isdir(path):
        return [path]
    files = []
    for root, dirs, names in os.walk(path):
        dirs[:] = [d for d in dirs if not d.startswith(".")]
        files.extend(os.path.join(root, n) for n in names if not n.startswith("."))
    return sorted(files, key=lambda f: os.path.relpath(f, path).split(os.sep))


def iter_documents(inputs: Sequence[str], input_format: str, *, stats: SourceStats | None = None,
                   max_line_chars: int = DEFAULT_MAX_LINE_CHARS, tfds_data_dir: str | None = None,
                   tfds_text_feature: str = "text") -> Iterator[list[str]]:
    """Documents (lists of sentences) from the inputs, streamed in a deterministic order.

    Inputs, format and binary files are checked at once; an empty corpus raises UserError when
    the stream ends.
    `stats`, when given, is filled in as documents are read.
    """
    check_choice("input format", input_format, FORMATS, unknown=True)
    if max_line_chars < 1:
        raise UserError(f"max_line_chars must be positive, got {max_line_chars}")
    files = resolve_inputs(inputs)
    check_readable_text(files)  # now, before any work starts, not hours into a run
    stats = stats if stats is not None else SourceStats()

    def generate() -> Iterator[list[str]]:
        for path in files:
            yield from documents_of(path, input_format, stats, max_line_chars=max_line_chars,
                                    tfds_data_dir=tfds_data_dir,
                                    tfds_text_feature=tfds_text_feature)
        if stats.documents == 0:
            raise empty_corpus(inputs, input_format, stats, max_line_chars)

    return generate()


def documents_of(path: str, input_format: str, stats: SourceStats, *,
                 max_line_chars: int = DEFAULT_MAX_LINE_CHARS, tfds_data_dir: str | None = None,
                 tfds_text_feature: str = "text") -> Iterator[list[str]]:
    """The documents of one resolved input (a file or a `tfds:` spec), counted in `stats`: what
    `iter_documents` streams for each input in turn, and what a distributed reader reads alone."""
    if is_tfds(path):
        documents = _tfds_documents(path, stats, tfds_data_dir, tfds_text_feature)
    else:
        documents = _file_documents(path, input_format, stats, max_line_chars)
    for document in documents:
        stats.documents += 1
        stats.sentences += len(document)
        yield document


def empty_corpus(inputs: Sequence[str], input_format: str, stats: SourceStats,
                 max_line_chars: int) -> UserError:
    """The refusal of inputs that held no document, with why lines were skipped."""
    named = ", ".join(inputs[:3]) + (", ..." if len(inputs) > 3 else "")
    return UserError(f"the corpus is empty: no document in {named} (format {input_format})"
                     + skipped_lines_note(stats, max_line_chars))


def check_readable_text(files: Sequence[str]) -> None:
    """UserError for a file input that cannot be read or looks binary: checked before any work."""
    for path in files:
        if not is_tfds(path):
            _check_not_binary(path)


def skipped_lines_note(stats: SourceStats, max_line_chars: int) -> str:
    """Why lines were left out, for a message about the corpus ('' when none were)."""
    notes = []
    overlong = stats.skipped_lines.get("overlong", 0)
    if overlong:
        notes.append(f"{_lines(overlong)} skipped as longer than the limit of {max_line_chars:,} "
                     "characters a line (max_line_chars; raise it with --max-line-chars of "
                     "python -m bertjax.data.prepare, or split the text into lines)")
    invalid = stats.skipped_lines.get("invalid_utf8", 0)
    if invalid:
        notes.append(f"{_lines(invalid)} skipped as not valid UTF-8")
    return "".join(f"; {note}" for note in notes)


def _lines(count: int) -> str:
    return f"{count:,} line was" if count == 1 else f"{count:,} lines were"


def _cut(document: list[str], stats: SourceStats) -> Iterator[list[str]]:
    if len(document) > MAX_DOCUMENT_SENTENCES:
        stats.cut_documents += 1
    for start in range(0, len(document), MAX_DOCUMENT_SENTENCES):
        yield document[start:start + MAX_DOCUMENT_SENTENCES]


def _file_documents(path: str, input_format: str, stats: SourceStats,
                    max_line_chars: int) -> Iterator[list[str]]:
    try:
        if input_format == "mediawiki":
            with _open_binary(path) as stream:
                for article in wikitext.iter_articles(stream, stats.skipped_pages, path):
                    yield from _cut([s for p in article.paragraphs for s in split_sentences(p)],
                                    stats)
            return
        split = input_format == "paragraphs"
        document: list[str] = []
        for line in _read_lines(path, max_line_chars, stats):
            if line:
                document.extend(split_sentences(line) if split else [line])
            elif document:
                yield document
                document = []
            while len(document) > MAX_DOCUMENT_SENTENCES:
                stats.cut_documents += 1
                yield document[:MAX_DOCUMENT_SENTENCES]
                document = document[MAX_DOCUMENT_SENTENCES:]
        if document:
            yield document
    except (OSError, EOFError) as e:  # corrupt or truncated compressed streams
        raise UserError(f"cannot read {path}: {e}") from None


def _open_binary(path: str) -> BinaryIO:
    if path.endswith(".gz"):
        return gzip.open(path, "rb")
    if path.endswith(".bz2"):
        return bz2.open(path, "rb")
    return open(path, "rb")


def _check_not_binary(path: str) -> None:
    try:
        with _open_binary(path) as f:
            head = f.read(_SNIFF_BYTES)
    except (OSError, EOFError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    if b"\0" in head:
        raise UserError(f"{path} looks binary (it holds NUL bytes); inputs must be UTF-8 text")


def _read_lines(path: str, max_line_chars: int, stats: SourceStats) -> Iterator[str]:
    """Stripped lines ('' for blank ones); never holds more than max_line_chars + 1 characters."""
    with io.TextIOWrapper(_open_binary(path), encoding="utf-8", errors="surrogateescape") as f:
        while True:
            line = f.readline(max_line_chars + 1)
            if not line:
                return
            if len(line) > max_line_chars and not line.endswith("\n"):
                _skip_rest_of_line(f, max_line_chars)
                stats.skipped_lines["overlong"] += 1
            elif _UNDECODABLE.search(line):
                stats.skipped_lines["invalid_utf8"] += 1
            else:
                yield line.strip()


def _skip_rest_of_line(f: TextIO, chunk: int) -> None:
    while True:
        rest = f.readline(chunk)
        if not rest or rest.endswith("\n"):
            return


def parse_tfds_spec(spec: str) -> tuple[str, str]:
    """'tfds:NAME[:SPLIT]' -> (NAME, SPLIT); NAME may carry a version ('wiki/en:1.0.0')."""
    body = spec[len(TFDS_PREFIX):]
    name, sep, split = body.rpartition(":")
    if not sep or _TFDS_VERSION.fullmatch(split):
        name, split = body, "train"
    if not name:
        raise UserError(f"bad TFDS input {spec!r}: expected tfds:NAME[:SPLIT]")
    return name, split


def _first_line(error: Exception) -> str:
    return (str(error).strip().splitlines() or [type(error).__name__])[0][:300]


def tensorflow_datasets(spec: str):
    """The tensorflow_datasets module (the tfds extra, with array_record, the format bertjax
    reads TFDS datasets in), to read the input `spec`."""
    tfds = extras.require("tensorflow_datasets", "tfds", f"reading {spec}")
    extras.require("array_record", "tfds", f"reading {spec}")
    return tfds


def _tfds_documents(spec: str, stats: SourceStats, data_dir: str | None,
                    feature: str) -> Iterator[list[str]]:
    tfds = tensorflow_datasets(spec)
    name, split = parse_tfds_spec(spec)
    try:
        source = tfds.data_source(name, split=split, data_dir=data_dir, download=False)
    except Exception as e:  # tfds reports a missing dataset through several exception types
        raise UserError(f"cannot open TFDS dataset {name} (split {split}; prepare it first with "
                        f"`tfds build`, in array_record format): {_first_line(e)}") from None
    for start in range(0, len(source), _TFDS_BATCH):
        for record in source.__getitems__(range(start, min(start + _TFDS_BATCH, len(source)))):
            if feature not in record:
                raise UserError(f"TFDS dataset {name} has no feature {feature!r} "
                                f"(it has {', '.join(sorted(record))})")
            text = record[feature]
            if isinstance(text, bytes):
                try:
                    text = text.decode("utf-8")
                except UnicodeDecodeError:
                    stats.skipped_lines["invalid_utf8"] += 1
                    continue
            yield from _cut([s for p in text.split("\n") for s in split_sentences(p)], stats)
