"""Reading a corpus and queries, refusing what would make a search meaningless in one line.

    corpus   jsonl, one document a line: {"id": "d1", "text": "..."}; ids unique (numbers are
             read as their decimal text), texts not blank
    queries  .txt: one query a line (blank lines skipped; the id is the line number), or
             .jsonl: {"text": "...", "id": "q1" (default: the line number),
                      "relevant": ["d1", ...] (what `evaluate` scores against)}
"""

from __future__ import annotations

import dataclasses
import json

from bertjax.core import transfer
from bertjax.core.errors import UserError


@dataclasses.dataclass(frozen=True)
class Document:
    id: str
    text: str


@dataclasses.dataclass(frozen=True)
class Query:
    id: str
    text: str
    relevant: tuple[str, ...] | None = None


def _lines(path: str) -> list[tuple[int, str]]:
    try:
        with open(transfer.local_copy(path), encoding="utf-8") as f:
            lines = [(n, line.strip()) for n, line in enumerate(f, start=1)]
    except FileNotFoundError:
        raise UserError(f"file not found: {path}") from None
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    lines = [(n, line) for n, line in lines if line]
    if not lines:
        raise UserError(f"{path} is empty")
    return lines


def _record(path: str, number: int, line: str) -> dict:
    try:
        value = json.loads(line)
    except json.JSONDecodeError as e:
        raise UserError(f"{path} line {number}: not JSON ({e.msg})") from None
    if not isinstance(value, dict):
        raise UserError(f"{path} line {number}: expected a JSON object")
    return value


def _id(path: str, number: int, value) -> str:
    if isinstance(value, bool) or not isinstance(value, (str, int)) or str(value) == "":
        raise UserError(f"{path} line {number}: the id must be a non-empty string or an integer, "
                        f"got {value!r}")
    return str(value)


def _text(path: str, number: int, record: dict) -> str:
    text = record.get("text")
    if not isinstance(text, str) or not text.strip():
        raise UserError(f"{path} line {number}: no \"text\" (a non-blank string)")
    return text


def read_corpus(path: str) -> list[Document]:
    documents, seen = [], {}
    for number, line in _lines(path):
        record = _record(path, number, line)
        if "id" not in record:
            raise UserError(f"{path} line {number}: no \"id\"")
        doc_id = _id(path, number, record["id"])
        if doc_id in seen:
            raise UserError(f"{path}: duplicate document id {doc_id!r} (lines {seen[doc_id]} "
                            f"and {number})")
        seen[doc_id] = number
        documents.append(Document(doc_id, _text(path, number, record)))
    return documents


def read_queries(path: str, *, relevant: bool = False) -> list[Query]:
    """The queries of a .txt or .jsonl file; with `relevant`, each must list its relevant ids."""
    if not path.lower().endswith(".jsonl"):
        if relevant:
            raise UserError(f"{path}: evaluation needs a .jsonl query file whose lines list "
                            "their \"relevant\" document ids")
        return [Query(str(number), line) for number, line in _lines(path)]
    queries, seen = [], set()
    for number, line in _lines(path):
        record = _record(path, number, line)
        query_id = _id(path, number, record.get("id", number))
        if query_id in seen:
            raise UserError(f"{path}: duplicate query id {query_id!r} (line {number})")
        seen.add(query_id)
        ids = record.get("relevant")
        if ids is not None:
            if (not isinstance(ids, list) or not ids
                    or any(isinstance(i, bool) or not isinstance(i, (str, int)) for i in ids)):
                raise UserError(f"{path} line {number}: \"relevant\" must be a non-empty list of "
                                "document ids")
            ids = tuple(str(i) for i in ids)
        elif relevant:
            raise UserError(f"{path} line {number}: no \"relevant\" document ids (evaluation "
                            "needs them on every query)")
        queries.append(Query(query_id, _text(path, number, record), ids))
    return queries
