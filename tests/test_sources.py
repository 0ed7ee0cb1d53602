"""Corpus sources: every input format, the sentence splitter, MediaWiki stripping, TFDS and
bad input."""

import bz2
import collections
import gzip
import os
import sys
import tracemalloc

import pytest

from bertjax.data import demo_corpus, inputs, sources, wikitext
from bertjax.data.sentence_splitting import split_sentences
from bertjax.data.sources import SourceStats, iter_documents
from bertjax.core.errors import UserError

SENTENCES_TEXT = "First sentence.\nSecond one.\n\n  \nThird, new document.\n\n\nFourth.\n"
SENTENCES_DOCS = [["First sentence.", "Second one."], ["Third, new document."], ["Fourth."]]


def write(path, text, opener=open):
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with opener(path, "wb") as f:
        f.write(text.encode("utf-8") if isinstance(text, str) else text)
    return str(path)


# --- formats -------------------------------------------------------------------------------------

@pytest.mark.parametrize("suffix,opener", [("", open), (".gz", gzip.open), (".bz2", bz2.open)])
def test_sentences_format_plain_and_compressed(tmp_path, suffix, opener):
    path = write(os.path.join(tmp_path, "c.txt" + suffix), SENTENCES_TEXT, opener)
    stats = SourceStats()
    assert list(iter_documents([path], "sentences", stats=stats)) == SENTENCES_DOCS
    assert (stats.documents, stats.sentences) == (3, 4)


def test_end_of_file_ends_a_document_and_crlf_lines(tmp_path):
    a = write(os.path.join(tmp_path, "a.txt"), "A one.\r\nA two.")  # no final newline
    b = write(os.path.join(tmp_path, "b.txt"), "B one.\n")
    assert list(iter_documents([a, b], "sentences")) == [["A one.", "A two."], ["B one."]]


def test_directories_recursive_sorted_and_globs(tmp_path):
    root = os.path.join(tmp_path, "corpus")
    write(os.path.join(root, "b.txt"), "b\n")
    write(os.path.join(root, "a", "z.txt.gz"), "az\n", gzip.open)
    write(os.path.join(root, "a", "y.txt"), "ay\n")
    write(os.path.join(root, ".hidden"), "hidden\n")
    write(os.path.join(root, "c.txt.bz2"), "c\n", bz2.open)
    expected = [["ay"], ["az"], ["b"], ["c"]]
    assert list(iter_documents([root], "sentences")) == expected
    assert list(iter_documents([os.path.join(root, "**", "*.txt*")], "sentences")) == expected
    # Inputs keep their given order; a file named twice is read once.
    b = os.path.join(root, "b.txt")
    assert list(iter_documents([b, root], "sentences")) == [["b"], ["ay"], ["az"], ["c"]]


def test_paragraphs_format(tmp_path):
    text = ("Dr. Smith arrived at 3.30 p.m. on Monday. He left soon.\n"
            "A second paragraph. Still the same document!\n"
            "\n"
            "New document? Yes.\n")
    path = write(os.path.join(tmp_path, "p.txt"), text)
    assert list(iter_documents([path], "paragraphs")) == [
        ["Dr. Smith arrived at 3.30 p.m. on Monday.", "He left soon.", "A second paragraph.",
         "Still the same document!"],
        ["New document?", "Yes."]]


def test_overlong_documents_are_cut(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "MAX_DOCUMENT_SENTENCES", 2)
    path = write(os.path.join(tmp_path, "c.txt"), "1\n2\n3\n4\n5\n\n6\n")
    stats = SourceStats()
    assert list(iter_documents([path], "sentences", stats=stats)) == [
        ["1", "2"], ["3", "4"], ["5"], ["6"]]
    assert stats.cut_documents == 2


# --- the sentence splitter ---------------------------------------------------------------------

@pytest.mark.parametrize("text,expected", [
    ("Dr. Watson met Mr. Holmes. They talked.", ["Dr. Watson met Mr. Holmes.", "They talked."]),
    ("Pi is about 3.14159. It is irrational.", ["Pi is about 3.14159.", "It is irrational."]),
    ("Fruit, e.g. apples, i.e. red ones. Fine.", ["Fruit, e.g. apples, i.e. red ones.", "Fine."]),
    ("The U.S. Army grew. The U.S. economy too.", ["The U.S. Army grew.", "The U.S. economy too."]),
    ("He moved to the U.S. The move was hard.", ["He moved to the U.S.", "The move was hard."]),
    ('He said "Stop." Then he left.', ['He said "Stop."', "Then he left."]),
    ("It ended (finally.) Next came more.", ["It ended (finally.)", "Next came more."]),
    ("Wait... What now? Go! OK.", ["Wait...", "What now?", "Go!", "OK."]),
    ("He paused... and went on.", ["He paused... and went on."]),
    ("J. R. R. Tolkien wrote it. See Fig. 3 below.", ["J. R. R. Tolkien wrote it.",
                                                       "See Fig. 3 below."]),
    ("It cost approx. 5 dollars in 1990. 1991 was worse.",
     ["It cost approx. 5 dollars in 1990.", "1991 was worse."]),
    ("Pears, etc. are sold by Acme Ltd. The firm grew.", ["Pears, etc. are sold by Acme Ltd.",
                                                          "The firm grew."]),
    ("Acme Inc. Products sell well.", ["Acme Inc. Products sell well."]),
    ("He holds a Ph.D. in physics.", ["He holds a Ph.D. in physics."]),
    ("ends with a quote.' 'Next starts.", ["ends with a quote.'", "'Next starts."]),
    ("他来了。她走了！好吗？", ["他来了。", "她走了！", "好吗？"]),
    ("no terminal punctuation", ["no terminal punctuation"]),
    ("   ", []),
    ("Version 2.0 shipped. Users liked it.", ["Version 2.0 shipped.", "Users liked it."]),
])
def test_split_sentences(text, expected):
    assert split_sentences(text) == expected


def test_split_sentences_keeps_every_character():
    text = "A b. C d! E f? G... H (i.) J \"k.\" L"
    assert "".join(split_sentences(text)).replace(" ", "") == text.replace(" ", "")


# --- MediaWiki ---------------------------------------------------------------------------------

def test_wikitext_stripping():
    markup = """{{Infobox person|name={{nowrap|X}}|born={{birth date|1900|1|1}}}}
'''Ada''' (born 1900<ref name="a">{{cite book|title=T}}</ref>) was a [[mathematician|math person]]
who wrote [[algorithm]]s.<ref name="b"/> She lived in [[London]].<!-- a comment --> __NOTOC__
[[File:Ada.jpg|thumb|Her portrait, with [[Charles Babbage|Babbage]].]]
[[Category:Mathematicians]]

== Work ==
She used [http://example.com the engine] &amp; ''notes'' on <span>the machine</span>.<br/>It ran.
{| class="wikitable"
|-
| cell || {{flag|UK}}
|}
* A list item long enough to keep.
: An indented line also long enough.

== References ==
Some reference prose that must be dropped entirely.
=== Sub ===
Also dropped under references.
== Legacy ==
Kept again after the dropped section ends.
"""
    paragraphs = wikitext.wikitext_to_paragraphs(markup)
    assert paragraphs == [
        "Ada (born 1900) was a math person who wrote algorithms. She lived in London.",
        "She used the engine & notes on the machine. It ran.",
        "A list item long enough to keep.",
        "An indented line also long enough.",
        "Kept again after the dropped section ends.",
    ]


def dump(pages):
    redirect_tag = '<redirect title="Kept" />'
    body = "".join(
        f"<page><title>{title}</title><ns>{ns}</ns>{redirect_tag if redirect else ''}"
        f'<revision><text xml:space="preserve">{text}</text></revision></page>'
        for title, ns, redirect, text in pages)
    return ('<mediawiki xmlns="http://www.mediawiki.org/xml/export-0.10/">'
            f"<siteinfo><sitename>W</sitename></siteinfo>{body}</mediawiki>")


def test_mediawiki_pages_kept_and_dropped(tmp_path):
    prose = "This article has enough prose to be kept as a document. " * 5
    path = write(os.path.join(tmp_path, "dump.xml.bz2"), dump([
        ("Kept", 0, False, prose + "\n\nSecond paragraph with several words here."),
        ("Redirect element", 0, True, "#REDIRECT [[Kept]]"),
        ("Redirect text", 0, False, "#redirect [[Kept]]"),
        ("Talk:Kept", 1, False, prose),
        ("Stub", 0, False, "Too short an article."),
    ]), bz2.open)
    stats = SourceStats()
    documents = list(iter_documents([path], "mediawiki", stats=stats))
    assert len(documents) == 1 and documents[0][-1] == "Second paragraph with several words here."
    assert stats.skipped_pages == {"redirect": 2, "other_namespace": 1, "too_short": 1}


def test_mediawiki_real_dump(wikipedia_dump_path):
    skipped = collections.Counter()
    with bz2.open(wikipedia_dump_path) as stream:
        articles = list(wikitext.iter_articles(stream, skipped))
    # 206 pages: 99 redirects, one Wikipedia: page, 106 articles.
    assert len(articles) == 106
    assert skipped == {"redirect": 99, "other_namespace": 1}
    titles = [a.title for a in articles]
    assert titles[:3] == ["Anarchism", "Autism", "Albedo"]
    assert "AccessibleComputing" not in titles  # a redirect
    text = "\n".join(p for a in articles for p in a.paragraphs)
    for leftover in ("{{", "}}", "[[", "]]", "<ref", "</ref", "{|", "|}", "<!--", "&nbsp;",
                     "'''", "__NOTOC__", "[http", "thumb|"):
        assert leftover not in text, leftover
    autism = articles[1].paragraphs[0]
    assert autism.startswith("Autism is a neurodevelopmental disorder characterized by impaired "
                             "social interaction")
    assert split_sentences(articles[0].paragraphs[0])[0] == (
        "Anarchism is a political philosophy that advocates self-governed societies based on "
        "voluntary institutions.")
    assert sum(len(split_sentences(p)) for a in articles for p in a.paragraphs) > 15_000


def test_demo_corpus_cli(tmp_path, capsys):
    output = str(tmp_path / "demo" / "wiki.txt")
    demo_corpus.main(["--output", output])
    assert capsys.readouterr().out == (
        f"wrote {output}: 106 articles kept, 99 redirects dropped (1 other pages dropped), "
        "20339 sentences, 434397 words\n")
    with open(output, "rb") as written, open(demo_corpus.demo_corpus_path(), "rb") as cached:
        assert written.read() == cached.read()
    assert list(iter_documents([output], "sentences"))[0][0].startswith("Anarchism is")
    demo_corpus.main(["--output", output])
    assert capsys.readouterr().out == f"{output} exists already; left as it is\n"
    assert not [n for n in os.listdir(tmp_path / "demo") if n != "wiki.txt"]  # no temporaries


def test_mediawiki_malformed(tmp_path):
    path = write(os.path.join(tmp_path, "bad.xml"), "<mediawiki><page><title>x</title>")
    with pytest.raises(UserError, match="not a well-formed MediaWiki XML dump"):
        list(iter_documents([path], "mediawiki"))


def test_tfds_not_installed(monkeypatch):
    monkeypatch.setitem(sys.modules, "tensorflow_datasets", None)  # makes the import fail
    with pytest.raises(UserError, match=r"needs the tfds extra .*: pip install 'bertjax\[tfds\]'"):
        list(iter_documents(["tfds:wikipedia/20230601.en"], "sentences"))


def test_parse_tfds_spec():
    assert sources.parse_tfds_spec("tfds:wikipedia/20230601.en") == ("wikipedia/20230601.en",
                                                                     "train")
    assert sources.parse_tfds_spec("tfds:wiki:validation") == ("wiki", "validation")
    assert sources.parse_tfds_spec("tfds:wiki:1.2.0") == ("wiki:1.2.0", "train")
    assert sources.parse_tfds_spec("tfds:wiki:1.2.0:test") == ("wiki:1.2.0", "test")


# --- bad input ---------------------------------------------------------------------------------

def test_missing_inputs(tmp_path):
    with pytest.raises(UserError, match="input not found"):
        iter_documents([str(tmp_path / "absent.txt")], "sentences")
    with pytest.raises(UserError, match="no file matches"):
        iter_documents([str(tmp_path / "*.absent")], "sentences")
    with pytest.raises(UserError, match="no input given"):
        iter_documents([], "sentences")
    with pytest.raises(UserError, match="unknown input format"):
        iter_documents([str(tmp_path)], "csv")


@pytest.mark.parametrize("content", ["", "\n\n  \n\t\n"])
def test_empty_corpus(tmp_path, content):
    path = write(os.path.join(tmp_path, "empty.txt"), content)
    with pytest.raises(UserError, match="the corpus is empty"):
        list(iter_documents([path], "sentences"))


def test_empty_directory(tmp_path):
    with pytest.raises(UserError, match="hold no files"):
        iter_documents([str(tmp_path)], "sentences")


def test_binary_and_corrupt_files(tmp_path):
    binary = write(os.path.join(tmp_path, "model.bin"), b"text\n\x00\x01\x02" * 100)
    with pytest.raises(UserError, match="looks binary"):
        list(iter_documents([binary], "sentences"))
    fake_gz = write(os.path.join(tmp_path, "fake.txt.gz"), "not gzip at all\n")
    with pytest.raises(UserError, match="cannot read"):
        list(iter_documents([fake_gz], "sentences"))
    truncated = os.path.join(tmp_path, "cut.txt.gz")
    lines = "".join(f"line {i}\n" for i in range(100_000)).encode()
    write(truncated, gzip.compress(lines)[:5000])
    with pytest.raises(UserError, match="cannot read"):
        list(iter_documents([truncated], "sentences"))


def test_invalid_utf8_lines_are_skipped_and_counted(tmp_path):
    path = write(os.path.join(tmp_path, "c.txt"), b"good one\nbad \xff\xfe line\ngood two\n"
                                                  b"caf\xe9 latin-1\n\nnext\n")
    stats = SourceStats()
    assert list(iter_documents([path], "sentences", stats=stats)) == [
        ["good one", "good two"], ["next"]]
    assert stats.skipped_lines == {"invalid_utf8": 2}


def test_overlong_lines_are_skipped_with_bounded_memory(tmp_path):
    path = os.path.join(tmp_path, "long.txt")
    with open(path, "w") as f:
        f.write("before\n" + "x" * 10_000_000 + "\nafter\n\n" + "y" * 5_000_000)  # no final \n
    stats = SourceStats()
    tracemalloc.start()
    documents = list(iter_documents([path], "sentences", stats=stats, max_line_chars=1000))
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert documents == [["before", "after"]]
    assert stats.skipped_lines == {"overlong": 2}
    assert peak < 1_000_000  # a 10 MB line was never held whole
    # The default limit (1,000,000 characters) skips the 10 MB line too.
    stats = SourceStats()
    assert list(iter_documents([path], "sentences", stats=stats)) == [["before", "after"]]
    assert stats.skipped_lines == {"overlong": 2}


def test_line_length_limit_is_exact(tmp_path):
    path = write(os.path.join(tmp_path, "c.txt"), "abcde\nabcdef\nabcd\n")
    stats = SourceStats()
    assert list(iter_documents([path], "sentences", stats=stats, max_line_chars=5)) == [
        ["abcde", "abcd"]]
    assert stats.skipped_lines == {"overlong": 1}


def test_the_demo_corpus_is_an_input_name():
    assert inputs.resolve_inputs([inputs.DEMO_INPUT]) == [demo_corpus.demo_corpus_path()]
