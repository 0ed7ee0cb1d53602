"""Fine-tuning data in: named-column tables (GLUE-style TSV, CSV, JSONL), CoNLL, SQuAD v1.1 JSON,
TFDS (`tfds:glue/sst2:validation`) and the packaged real datasets (`packaged:NAME:SPLIT`).

Retrieval rows (kind "retrieval") are tables too: a query (`text`), its positive document
(`text_pair`) and, optionally, a hard negative (`negative`), with no label column.

Every reader returns plain examples; a problem with the input is a UserError naming the file and
the line (a column that does not exist, a missing label, a malformed row, a quoted CSV field that
runs over a line break: tables hold one example a line, and such a field is almost always an
unterminated quote merging the rows after it), never a traceback.
Labels stay strings here (numbers for regression); the task maps them to ids.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import os
import sys
from typing import Iterator

from bertjax.core import storage, transfer
from bertjax.core.errors import UserError
from bertjax.core import extras
from bertjax.data.sources import parse_tfds_spec, tensorflow_datasets
from bertjax.finetune.conll import read_conll
from bertjax.finetune.examples import PACKAGED_PREFIX, SpanExample, TextExample
from bertjax.finetune.packaged import datasets
from bertjax.finetune.squad import read_squad

FORMATS = ("tsv", "csv", "jsonl", "conll", "squad")
_EXTENSIONS = {".tsv": "tsv", ".csv": "csv", ".jsonl": "jsonl", ".conll": "conll",
               ".json": "squad"}
TFDS_PREFIX = "tfds:"


@dataclasses.dataclass(frozen=True)
class Columns:
    text: str = "sentence"
    text_pair: str = ""  # empty: single sentences
    label: str = "label"
    id: str = ""  # empty: the row number
    span_start: str = "start"  # span classification: character offsets, end exclusive
    span_end: str = "end"
    negative: str = ""  # retrieval: the hard negative's column; empty: none


@dataclasses.dataclass
class Source:
    """Where examples come from and how to read them."""

    path: str
    format: str = ""  # empty: from the file extension
    columns: Columns = Columns()
    labeled: bool = True  # False for prediction inputs: labels are optional
    regression: bool = False
    tfds_data_dir: str | None = None


def resolve_format(path: str, given: str, default: str) -> str:
    if given:
        if given not in FORMATS:
            raise UserError(f"data.format must be one of {', '.join(FORMATS)}, got {given!r}")
        return given
    return _EXTENSIONS.get(os.path.splitext(path)[1].lower(), default)


def read(source: Source, kind: str) -> list:
    """Examples of `kind` ("text", "retrieval", "tagged", "qa" or "span") from `source`;
    UserError when empty."""
    if source.path.startswith(PACKAGED_PREFIX):
        examples = datasets.read_packaged(source.path, kind)
        if kind == "retrieval" and not source.columns.negative:
            examples = [dataclasses.replace(e, negative=None) for e in examples]
    elif source.path.startswith(TFDS_PREFIX):
        examples = _read_tfds(source, kind)
    else:
        if storage.is_url(source.path):  # read from this host's copy; messages name the URL
            if not storage.isfile(source.path):
                raise UserError(f"data file not found: {source.path}")
            examples = read(dataclasses.replace(source, path=transfer.local_copy(source.path)),
                            kind)
            return examples
        if not os.path.isfile(source.path):
            raise UserError(f"data file not found: {source.path}")
        default = {"text": "tsv", "retrieval": "jsonl", "tagged": "conll", "qa": "squad",
                   "span": "tsv"}[kind]
        fmt = resolve_format(source.path, source.format, default)
        tables = ("tsv", "csv", "jsonl")
        expected = {"text": tables, "retrieval": tables, "tagged": ("conll",), "qa": ("squad",),
                    "span": tables}[kind]
        if fmt not in expected:
            raise UserError(f"{source.path}: format {fmt} cannot hold this task's examples "
                            f"(use {' or '.join(expected)})")
        if fmt == "conll":
            examples = read_conll(source.path, labeled=source.labeled)
        elif fmt == "squad":
            examples = read_squad(source.path, labeled=source.labeled)
        elif kind == "span":
            examples = list(_span_examples(_rows(source.path, fmt), source))
        else:
            examples = list(_text_examples(_rows(source.path, fmt), source,
                                           labels=kind == "text"))
    if not examples:
        raise UserError(f"no examples in {source.path}")
    return examples


def _rows(path: str, fmt: str) -> Iterator[tuple[int, dict]]:
    """(line number, {column: value}) for every data row of a table file."""
    try:  # utf-8-sig: a byte-order mark (GLUE's MRPC has one) is not part of a column name
        with open(path, encoding="utf-8-sig", newline="") as f:
            if fmt == "jsonl":
                for number, line in enumerate(f, 1):
                    if line.strip():
                        yield number, _json_row(path, number, line)
                return
            # GLUE's TSVs contain unbalanced quotes that are part of the text: no quoting there.
            quoting = csv.QUOTE_NONE if fmt == "tsv" else csv.QUOTE_MINIMAL
            reader = csv.reader(f, delimiter="\t" if fmt == "tsv" else ",", quoting=quoting)
            header = next(reader, None)
            if header is None:
                return
            _refuse_line_breaks(path, 1, reader.line_num, header)
            last_line = reader.line_num
            for row in reader:
                _refuse_line_breaks(path, last_line + 1, reader.line_num, row)
                last_line = reader.line_num
                if not any(cell.strip() for cell in row):
                    continue
                if len(row) != len(header):
                    raise UserError(f"{path}:{reader.line_num}: {len(row)} fields, the header "
                                    f"has {len(header)}")
                yield reader.line_num, dict(zip(header, row))
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not UTF-8 text: {e.reason}") from None
    except csv.Error as e:
        raise UserError(f"{path}: malformed {fmt}: {e}") from None


def _refuse_line_breaks(path: str, first: int, last: int, row: list[str]) -> None:
    """Tables hold one example a line. A row read over several lines is a quoted field that
    swallowed line breaks: almost always an unterminated quote merging the rows after it into
    one example, so it is refused rather than trained on."""
    if last > first and any("\n" in cell or "\r" in cell for cell in row):
        raise UserError(f"{path}:{first}: a quoted field runs on to line {last} (an unterminated "
                        "quote?); each row must be on one line")


def _json_row(path: str, number: int, line: str) -> dict:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as e:
        raise UserError(f"{path}:{number}: not JSON: {e.msg}") from None
    if not isinstance(row, dict):
        raise UserError(f"{path}:{number}: expected a JSON object per line")
    return row


def _text_examples(rows: Iterator[tuple[int, dict]], source: Source, labels: bool = True
                   ) -> Iterator[TextExample]:
    c = source.columns
    wanted = [name for name in (c.text, c.text_pair, c.id) if name]
    if not labels:
        wanted += [c.negative] if c.negative else []
    labeled = source.labeled and labels
    for number, row in rows:
        where = f"{source.path}:{number}"
        for name in wanted + ([c.label] if labeled else []):
            if name not in row:
                raise UserError(f"{where}: no column {name!r} (columns: "
                                f"{', '.join(map(str, row))}); set data.*_column")
        yield TextExample(
            id=str(row[c.id]) if c.id else str(number),
            text=_text(row[c.text], where, c.text),
            text_pair=_text(row[c.text_pair], where, c.text_pair) if c.text_pair else None,
            label=_label(row.get(c.label), where, source) if labels else None,
            negative=(_text(row[c.negative], where, c.negative)
                      if c.negative and not labels else None))


def _span_examples(rows: Iterator[tuple[int, dict]], source: Source) -> Iterator[SpanExample]:
    c = source.columns
    for number, row in rows:
        where = f"{source.path}:{number}"
        for name in [c.text, c.span_start, c.span_end, *([c.id] if c.id else []),
                     *([c.label] if source.labeled else [])]:
            if name not in row:
                raise UserError(f"{where}: no column {name!r} (columns: "
                                f"{', '.join(map(str, row))}); set data.*_column")
        text = _text(row[c.text], where, c.text)
        start, end = (_offset(row[name], where, name) for name in (c.span_start, c.span_end))
        check_span(text, start, end, where)
        yield SpanExample(str(row[c.id]) if c.id else str(number), text, start, end,
                          _label(row.get(c.label), where, source))


def _offset(value, where: str, column: str) -> int:
    text = str(value).strip()
    if isinstance(value, bool) or not text.lstrip("-").isdigit():
        raise UserError(f"{where}: column {column!r} is not a character offset: {value!r}")
    return int(text)


def check_span(text: str, start: int, end: int, where: str) -> None:
    """Characters [start, end) must be a non-empty part of `text`."""
    if start >= end:
        raise UserError(f"{where}: the span's start {start} is not before its end {end} (end "
                        "is exclusive)")
    if start < 0 or end > len(text):
        raise UserError(f"{where}: the span [{start}, {end}) is outside the text "
                        f"({len(text)} characters)")


def _text(value, where: str, column: str) -> str:
    if isinstance(value, bytes):
        value = value.decode("utf-8")
    if not isinstance(value, str):
        raise UserError(f"{where}: column {column!r} is not text: {value!r}")
    return value


def _label(value, where: str, source: Source) -> str | float | None:
    text = value.decode("utf-8") if isinstance(value, bytes) else value
    if isinstance(text, str):
        text = text.strip()
    if text in ("", None):
        if source.labeled:
            raise UserError(f"{where}: the label is missing")
        return None
    if source.regression:
        try:
            return float(text)
        except (TypeError, ValueError):
            raise UserError(f"{where}: the label {text!r} is not a number") from None
    return str(text)


def label_order(source: Source) -> tuple[str, ...]:
    """The label order a source declares: a TFDS ClassLabel's names in index order (MRPC:
    not_equivalent, equivalent), which is kept rather than sorted; empty for files."""
    if not source.path.startswith(TFDS_PREFIX):
        return ()
    return tuple(_class_names(_tfds_data(source), source.columns.label) or ())


def _read_tfds(source: Source, kind: str) -> list[TextExample]:
    """A TFDS dataset prepared in array_record format (read without TensorFlow), e.g. GLUE."""
    if kind != "text":
        raise UserError(f"{source.path}: TFDS input is supported for sentence tasks only")
    data = _tfds_data(source)
    label_names = _class_names(data, source.columns.label)
    rows = []
    for index in range(len(data)):
        record = dict(data[index])
        label = record.get(source.columns.label)
        if label is not None and label_names is not None:
            label = label_names[int(label)] if int(label) >= 0 else None  # GLUE test: -1
        elif label is not None and not source.regression:
            label = str(label)
        rows.append((index, {**record, source.columns.label: label}))
    return list(_text_examples(iter(rows), source))


def _tfds_data(source: Source):
    tfds = tensorflow_datasets(source.path)
    name, split = parse_tfds_spec(source.path)
    if name.startswith("glue"):  # importing it registers the glue/* builders
        extras.require("tensorflow_datasets.text.glue", "tfds", f"reading {source.path}")
    try:
        data = tfds.data_source(name, split=split, data_dir=source.tfds_data_dir, download=False)
    except Exception as e:  # tfds reports a missing dataset through several exception types
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise UserError(f"cannot open TFDS dataset {name} (split {split}); prepare it first with "
                        f"`tfds build {name} --file_format=array_record` (GLUE downloads its "
                        f"files, so this needs network access): {first}") from None
    return data


def _class_names(data, column: str) -> list[str] | None:
    try:
        feature = data.dataset_info.features[column]
    except (AttributeError, KeyError, TypeError):
        return None
    return list(feature.names) if hasattr(feature, "names") else None


def report_counts(what: str, counts: dict[str, int]) -> None:
    """One stderr line per counted event (skipped or truncated examples are never silent)."""
    for reason, count in sorted(counts.items()):
        if count:
            print(f"{what}: {count} {reason}", file=sys.stderr)
