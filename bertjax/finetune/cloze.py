"""Cloze inputs (PET): a template with one [MASK] around each example, and a verbalizer naming one
vocabulary token per label.

    template    "{text} It was [MASK]."   ({text_pair} places a pair's second text)
    verbalizer  "negative:terrible,positive:great"

An example becomes one sequence, [CLS] (prompt slots) template [SEP], all in segment 0: the
template's own words and the texts are tokenized separately and joined, and the literal [MASK]
becomes the mask token's id (the tokenizer would split the text "[MASK]" into "[", "mask", "]").
Only the texts are cut to fit max_seq_len, never the template, so every row keeps its [MASK];
`mask_position` records where it is.
"""

from __future__ import annotations

import collections
import dataclasses
import re
from typing import Sequence

import numpy as np

from bertjax.data.tokenizer import Tokenizer
from bertjax.core.errors import UserError
from bertjax.finetune.features import Features, _pad, truncate_pair
from bertjax.finetune.examples import TextExample

MASK, TEXT, PAIR = "[MASK]", "{text}", "{text_pair}"
_PARTS = re.compile(r"(\[MASK\]|\{text\}|\{text_pair\})")


def parse_template(template: str) -> list[str]:
    """The template as literal pieces and the markers [MASK], {text}, {text_pair}; refuses one
    without exactly one [MASK], without {text}, or with another {placeholder}."""
    parts = [p for p in _PARTS.split(template) if p]
    count = parts.count(MASK)
    if count != 1:
        raise UserError(f"finetune.template must hold exactly one [MASK], {template!r} has "
                        f"{count}")
    if parts.count(TEXT) != 1 or parts.count(PAIR) > 1:
        raise UserError(f"finetune.template must place {{text}} once (and {{text_pair}} at most "
                        f"once), got {template!r}")
    unknown = sorted({m for p in parts if p not in (MASK, TEXT, PAIR)
                      for m in re.findall(r"\{[^{}]*\}", p)})
    if unknown:
        raise UserError(f"finetune.template has the unknown placeholder(s) {', '.join(unknown)}; "
                        "only {text} and {text_pair} are filled in")
    return parts


def parse_verbalizer(text: str) -> dict[str, str]:
    """"label:word,label:word" -> {label: word}; refuses a malformed entry, a label listed twice
    and a word given to two labels (their scores would always tie)."""
    pairs = []
    for entry in (e.strip() for e in text.split(",")):
        label, colon, word = entry.rpartition(":")
        if not colon or not label.strip() or not word.strip():
            raise UserError(f"finetune.verbalizer entry {entry!r} is not label:word (expected "
                            "e.g. negative:terrible,positive:great)")
        pairs.append((label.strip(), word.strip()))
    for index, what in ((0, "label"), (1, "word")):
        twice = sorted(k for k, n in collections.Counter(p[index] for p in pairs).items() if n > 1)
        if twice:
            listed = ", ".join(map(repr, twice))
            raise UserError(f"finetune.verbalizer gives the {what}(s) {listed} more than once")
    return dict(pairs)


def verbalizer_ids(tokenizer: Tokenizer, words: dict[str, str], labels: Sequence[str]
                   ) -> tuple[int, ...]:
    """The vocabulary id of each label's word, in label order; refuses a verbalizer that misses a
    label or names an unknown one, and a word that is not exactly one known token."""
    missing = [label for label in labels if label not in words]
    unknown = [label for label in words if label not in labels]
    if missing or unknown:
        problems = ([f"has no word for {', '.join(map(repr, missing))}"] if missing else []) + (
            [f"names {', '.join(map(repr, unknown))}, not a label"] if unknown else [])
        raise UserError(f"finetune.verbalizer {' and '.join(problems)} (the labels: "
                        f"{', '.join(labels)})")
    ids = []
    for label in labels:
        pieces = tokenizer.encode_batch([words[label]])[0].tolist()
        if len(pieces) != 1 or pieces[0] == tokenizer.special.unk:
            shown = tokenizer.tokens(pieces) if pieces else "nothing"
            raise UserError(f"finetune.verbalizer word {words[label]!r} (label {label!r}) is not "
                            f"one token of the vocabulary: it tokenizes to {shown}")
        ids.append(pieces[0])
    return tuple(ids)


@dataclasses.dataclass(frozen=True)
class ClozeLayout:
    template: str
    max_seq_len: int
    prompt_length: int = 0


def encode_cloze(tokenizer: Tokenizer, examples: Sequence[TextExample], layout: ClozeLayout,
                 labels: np.ndarray, where: str) -> Features:
    """Features with `mask_position` [N] beside the usual sentence arrays."""
    parts = parse_template(layout.template)
    paired = examples[0].text_pair is not None if examples else False
    if paired != (PAIR in parts):
        raise UserError(f"{where}: the examples {'have' if paired else 'have no'} second text but "
                        f"finetune.template {layout.template!r} "
                        f"{'lacks' if paired else 'places'} {{text_pair}}")
    special = tokenizer.special
    literals = [p for p in parts if p not in (MASK, TEXT, PAIR)]
    pieces = dict(zip(literals, tokenizer.encode_batch(literals))) if literals else {}
    fixed = 1 + sum(len(pieces[p]) for p in literals)
    budget = layout.max_seq_len - 2 - layout.prompt_length - fixed
    if budget < (2 if paired else 1):
        raise UserError(f"data.max_seq_len {layout.max_seq_len} leaves no room for the text: the "
                        f"template takes {fixed} tokens and the soft prompt "
                        f"{layout.prompt_length}")
    firsts = tokenizer.encode_batch([e.text for e in examples])
    seconds = tokenizer.encode_batch([e.text_pair for e in examples]) if paired else None
    rows, positions, counts = [], [], collections.Counter()
    for i, first in enumerate(firsts):
        a, b, cut = truncate_pair(first, seconds[i] if paired else None, budget)
        counts["example(s) truncated to max_seq_len"] += cut
        ids = [special.cls] + [special.pad] * layout.prompt_length
        for part in parts:
            if part == MASK:
                positions.append(len(ids))
                ids.append(special.mask)
            else:
                ids += (a if part == TEXT else b if part == PAIR else pieces[part]).tolist()
        rows.append(ids + [special.sep])
    arrays = {"input_ids": _pad(rows, layout.max_seq_len),
              "segment_ids": np.zeros((len(rows), layout.max_seq_len), np.int32),
              "input_mask": _pad([[1] * len(r) for r in rows], layout.max_seq_len),
              "mask_position": np.asarray(positions, np.int32),
              "label": np.asarray(labels), "weight": np.ones(len(rows), np.float32)}
    return Features(arrays, counts)
