"""Splitting a paragraph into sentences by rule (the `paragraphs` input format)."""

from __future__ import annotations

import re

# A period after these never ends a sentence (titles, references, months: a name or number follows).
_NEVER_FINAL = frozenset(
    "mr mrs ms dr prof st mt ft gen col lt sgt capt cmdr adm gov sen rep pres rev hon fr no nos "
    "vol vols fig figs p pp ch sec art eq ed eds approx ca cf vs viz al dept univ est "
    "jan feb mar apr jun jul aug sep sept oct nov dec".split())
# These end a sentence only when a typical sentence opener follows ("... in the U.S. The ...").
_OFTEN_FINAL = frozenset("etc inc ltd co corp jr sr bros".split())
_OPENERS = frozenset(
    "the a an this that these those it its he she they we i you there here in on at after before "
    "during but however although when while his her their our my as if for from by with some "
    "many most one both each since until".split())
_DOTTED = re.compile(r"(?:[A-Za-z]{1,2}\.)+[A-Za-z]{1,2}")  # U.S, e.g, Ph.D, a.m
_TERMINATOR = re.compile(r"(?:[.!?]+|…)[\"'”’»)\]]*(?=\s)|[。！？]+[」』”’）)]*")
_NEXT_WORD = re.compile(r"\s+[\"'“‘«(\[]*(\S+)")
_OPENING = "\"'“‘«(["


def split_sentences(text: str) -> list[str]:
    """Splits a paragraph into sentences by rule: '.', '!', '?', '…' (and closing quotes or
    brackets after them) followed by space and a word that does not start in lower case, except
    after titles and other abbreviations, initials ("J. R. R. Tolkien") and dotted acronyms
    ("U.S.", "e.g."). Decimals ("3.14") never split. CJK '。！？' split without a space.
    """
    sentences, start = [], 0
    for match in _TERMINATOR.finditer(text):
        if _ends_sentence(text, match):
            piece = text[start:match.end()].strip()
            if piece:
                sentences.append(piece)
            start = match.end()
    tail = text[start:].strip()
    if tail:
        sentences.append(tail)
    return sentences


def _ends_sentence(text: str, match: re.Match) -> bool:
    mark = match.group()
    if mark[0] in "。！？":
        return True
    following = _NEXT_WORD.match(text, match.end())
    if following is None:
        return False  # only space is left: the tail
    first = following.group(1)[0]
    if first.islower() or not (first.isalnum() or first in _OPENING):
        return False
    if not mark.startswith(".") or mark.startswith(".."):
        return True
    begin = match.start()
    while begin > 0 and not text[begin - 1].isspace():
        begin -= 1
    word = text[begin:match.start()].lstrip(_OPENING)
    lowered = word.lower()
    if lowered in _NEVER_FINAL or (len(word) == 1 and word.isalpha()):
        return False
    if lowered in _OFTEN_FINAL or _DOTTED.fullmatch(word):
        return following.group(1).strip(_OPENING).lower() in _OPENERS
    return True
