"""A MediaWiki XML dump -> articles as plain-prose paragraphs.

The dump is stream-parsed (each <page> is cleared once read), so dumps far larger than memory are
fine. Only namespace-0 pages that are not redirects are kept. The markup is stripped with
regular expressions, not a full wikitext parser: templates, tables, references, comments, files,
categories and the reference-like sections at the end of an article are dropped; links and
formatting keep their visible text. What is left reads like prose, which is what pretraining wants.
"""

from __future__ import annotations

import collections
import dataclasses
import html
import re
import xml.etree.ElementTree as ElementTree
from typing import BinaryIO, Iterator

from bertjax.core.errors import UserError

MIN_PARAGRAPH_WORDS = 4
MIN_ARTICLE_CHARS = 200
# Sections made of citations and link lists, not prose: dropped with everything under them.
_DROPPED_SECTIONS = frozenset((
    "references", "notes", "footnotes", "citations", "sources", "bibliography", "see also",
    "external links", "further reading", "works cited", "notes and references", "primary sources",
    "secondary sources", "general references", "specific references", "works", "discography",
    "filmography", "selected works", "publications"))
_LINK_DROPPED_NAMESPACES = frozenset(("file", "image", "media", "category"))

_COMMENT = re.compile(r"<!--.*?(?:-->|$)", re.S)
_REF = re.compile(r"<ref\b[^>]*?/>|<ref\b[^>]*?>.*?</ref\s*>", re.S | re.I)
# Elements whose content is not prose (formulas, code, galleries): dropped with their content.
_NON_PROSE = re.compile(
    r"<(math|chem|gallery|timeline|imagemap|score|syntaxhighlight|source|pre|graph|hiero|mapframe"
    r"|templatedata|references)\b[^>]*?(?:/>|>.*?</\1\s*>)", re.S | re.I)
_TEMPLATE = re.compile(r"\{\{(?:[^{}]|\{(?!\{)|\}(?!\}))*?\}\}", re.S)
_TABLE = re.compile(r"^\s*\{\|(?:(?!^\s*\{\|).)*?^\s*\|\}", re.S | re.M)
# Innermost links first; single brackets may occur inside ("[[X|the [above] text]]").
_LINK = re.compile(r"\[\[((?:[^\[\]]|\[(?!\[)|\](?!\]))*?)\]\]")
_EXTERNAL_LINK = re.compile(r"\[(?:https?:|ftp:)?//[^\s\]]*\s*([^\]]*)\]")
_TAG = re.compile(r"</?[A-Za-z][^<>]*?/?>")
_BR = re.compile(r"<br\s*/?>", re.I)
_QUOTES = re.compile(r"'{2,}")
_MAGIC_WORD = re.compile(r"__[A-Z]+__")
_HEADING = re.compile(r"^(=+)\s*(.*?)\s*\1\s*$")
_LIST_MARKER = re.compile(r"^[*#:;]+\s*")
_EMPTY_BRACKETS = re.compile(r"\(\s*[,;:]?\s*\)|\[\s*\]")
_SPACE_BEFORE_PUNCT = re.compile(r"\s+([,.;:!?)])")
_SPACES = re.compile(r"[ \t\u00a0]+")
_INTERWIKI = re.compile(r"[a-z]{2,3}(?:-[a-z]+)*:")


@dataclasses.dataclass(frozen=True)
class Article:
    title: str
    paragraphs: list[str]


def iter_articles(stream: BinaryIO, skipped: collections.Counter,
                  name: str = "the dump") -> Iterator[Article]:
    """Kept articles of a dump, in order; dropped pages are counted in `skipped` by reason."""
    context = ElementTree.iterparse(stream, events=("start", "end"))
    root = None
    try:
        for event, element in context:
            if root is None:
                root = element
            if event != "end" or _local(element.tag) != "page":
                continue
            article = _page_article(element, skipped)
            root.clear()  # pages already read must not pile up under the root
            if article is not None:
                yield article
    except ElementTree.ParseError as e:
        raise UserError(f"{name} is not a well-formed MediaWiki XML dump: {e}") from None


def _local(tag: str) -> str:
    return tag.rsplit("}", 1)[-1]


def _page_article(page: ElementTree.Element, skipped: collections.Counter) -> Article | None:
    fields = {_local(child.tag): child for child in page}
    namespace = (fields["ns"].text or "").strip() if "ns" in fields else "0"
    if namespace != "0":
        skipped["other_namespace"] += 1
        return None
    text = ""
    for child in fields.get("revision", ()):
        if _local(child.tag) == "text":
            text = child.text or ""
    if "redirect" in fields or text.lstrip()[:9].upper() == "#REDIRECT":
        skipped["redirect"] += 1
        return None
    paragraphs = wikitext_to_paragraphs(text)
    if sum(len(p) for p in paragraphs) < MIN_ARTICLE_CHARS:
        skipped["too_short"] += 1
        return None
    title = fields["title"].text if "title" in fields else ""
    return Article(title or "", paragraphs)


def wikitext_to_paragraphs(markup: str) -> list[str]:
    """The prose paragraphs of one article's wikitext."""
    text = _COMMENT.sub("", markup)
    text = _REF.sub("", text)
    text = _NON_PROSE.sub("", text)
    text = _repeat(_TEMPLATE, "", text)
    text = _repeat(_TABLE, "", text)
    text = _repeat(_LINK, _link_text, text)
    text = _EXTERNAL_LINK.sub(r"\1", text)
    text = _BR.sub(" ", text)
    text = _TAG.sub("", text)
    text = _QUOTES.sub("", text)
    text = _MAGIC_WORD.sub("", text)
    return _paragraphs(text)


def _repeat(pattern: re.Pattern, replacement, text: str, limit: int = 20) -> str:
    """Applies a pattern until nothing changes: innermost constructs go first, then their hosts."""
    for _ in range(limit):
        text, count = pattern.subn(replacement, text)
        if not count:
            break
    return text


def _link_text(match: re.Match) -> str:
    target, _, label = match.group(1).partition("|")
    namespace = target.split(":", 1)[0].strip().lower() if ":" in target else ""
    if namespace in _LINK_DROPPED_NAMESPACES or (
            _INTERWIKI.fullmatch(namespace + ":") and not label):
        return ""
    if label:
        # [[File:x.jpg|thumb|caption]] is gone above; here only the last pipe part is visible.
        return label.rsplit("|", 1)[-1]
    return target.lstrip(":").split("#", 1)[0] or target.lstrip(":#")


def _paragraphs(text: str) -> list[str]:
    """Blank lines, headings and list items delimit paragraphs; wrapped lines are joined."""
    paragraphs: list[str] = []
    current: list[str] = []
    dropped_level = 0  # inside a dropped section of this heading level (0: none)

    def flush() -> None:
        if current and not dropped_level:
            paragraph = _tidy(" ".join(current))
            if len(paragraph.split()) >= MIN_PARAGRAPH_WORDS:
                paragraphs.append(paragraph)
        current.clear()

    for raw in text.split("\n"):
        line = raw.strip()
        heading = _HEADING.match(line)
        if heading:
            flush()
            level = len(heading.group(1))
            if dropped_level and level > dropped_level:
                continue
            title = _tidy(heading.group(2)).lower()
            dropped_level = level if title in _DROPPED_SECTIONS else 0
        elif not line or line[0] in "|!{}" or line.startswith("----"):
            flush()  # paragraph break, or a leftover of a table or template
        elif line[0] in "*#:;":
            flush()
            current.append(_LIST_MARKER.sub("", line))
            flush()
        else:
            current.append(line)
    flush()
    return paragraphs


def _tidy(text: str) -> str:
    text = html.unescape(text)
    text = _EMPTY_BRACKETS.sub("", text)
    text = _SPACES.sub(" ", text)
    text = _SPACE_BEFORE_PUNCT.sub(r"\1", text)
    return text.strip()
