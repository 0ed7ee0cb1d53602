"""Parallel sentences for translation language modelling (XLM's TLM): pairs of translations.

Raw pairs are a text file, one pair a line, the two sides separated by a tab (`A<TAB>B`); which
languages they are in is said where the file is named: `data.parallel=en-es=PATH` (A is English,
B Spanish). Prepared, the pairs are tokenized once into the multilingual corpus's directory:

    DIR/parallel-<a>-<b>.npz   a_ids, a_bounds, b_ids, b_bounds (int32 ids, int64 offsets)

Real pairs: the King James Bible and the Reina-Valera 1909 Spanish Bible from Debian's SWORD
modules (sword-text-kjv, sword-text-sparv), both in the KJV versification, so that entry slot i
of one is verse i of the other (`bible_verse_pairs`; `apt-get download`, opt-in):

    python -m bertjax.data.parallel_text --output DIR/kjv-rv1909.tsv
"""

from __future__ import annotations

import argparse
import io
import os
import re
import sys

import numpy as np

from bertjax.core import atomic_files, debian_archive
from bertjax.core.errors import EXIT_BAD_INPUT, UserError, exit_on_user_error, report
from bertjax.data.sword_bible import bible_books, osis_text, sword_entries
from bertjax.data.sentence_splitting import split_sentences
from bertjax.data.tokenizer import Tokenizer

SPANISH_BIBLE = ("sword-text-sparv=2.60-1", "usr/share/sword/modules/texts/ztext/spaRV1909eb/")
_SPEC = re.compile(r"^([a-z][a-z0-9_]{0,15})-([a-z][a-z0-9_]{0,15})=(.+)$")


def parse_parallel(spec: str, name: str = "data.parallel") -> tuple[str, str, str]:
    """"en-es=PATH" -> ("en", "es", "PATH")."""
    match = _SPEC.match(spec.strip())
    if not match or match.group(1) == match.group(2):
        raise UserError(f"{name}: {spec!r} is not A-B=PATH (two different language codes of "
                        "data.languages, then a file of tab-separated pairs)")
    return match.group(1), match.group(2), match.group(3).strip()


def read_pairs(path: str) -> list[tuple[str, str]]:
    """The pairs of a tab-separated file; a line without exactly one tab, or with an empty side,
    is refused with its line number."""
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except (OSError, UnicodeDecodeError) as e:
        raise UserError(f"cannot read the parallel text {path}: {e}") from None
    pairs = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        sides = line.split("\t")
        if len(sides) != 2 or not sides[0].strip() or not sides[1].strip():
            raise UserError(f"{path}:{number}: not a pair (two non-empty sides, one tab between)")
        pairs.append((sides[0].strip(), sides[1].strip()))
    if not pairs:
        raise UserError(f"the parallel text {path} holds no pairs")
    return pairs


def pairs_path(directory: str, a: str, b: str) -> str:
    return os.path.join(directory, f"parallel-{a}-{b}.npz")


def prepare_pairs(path: str, a: str, b: str, directory: str, tokenizer: Tokenizer) -> str:
    """Tokenizes the pairs of `path` into `directory` (once: an existing file is kept)."""
    target = pairs_path(directory, a, b)
    if os.path.exists(target):
        return target
    pairs = read_pairs(path)
    arrays = {}
    for side, texts in (("a", [p[0] for p in pairs]), ("b", [p[1] for p in pairs])):
        ids = [np.asarray(i, np.int32) for i in tokenizer.encode_batch(texts)]
        arrays[f"{side}_ids"] = np.concatenate(ids)
        arrays[f"{side}_bounds"] = np.concatenate([[0], np.cumsum([len(i) for i in ids])])
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    with atomic_files.replacing(target, "wb", encoding=None) as f:
        f.write(buffer.getvalue())
    return target


class ParallelPairs:
    """Tokenized translation pairs: side A in language `a`, side B in `b`."""

    def __init__(self, path: str, a: str, b: str):
        try:
            with np.load(path) as arrays:
                self.a_ids, self.a_bounds = arrays["a_ids"], arrays["a_bounds"]
                self.b_ids, self.b_bounds = arrays["b_ids"], arrays["b_bounds"]
        except (OSError, ValueError, KeyError) as e:
            raise UserError(f"cannot read the prepared pairs {path}: {e}") from None
        self.a, self.b, self.path = a, b, path

    def __len__(self) -> int:
        return len(self.a_bounds) - 1

    def pair(self, index: int) -> tuple[np.ndarray, np.ndarray]:
        return (self.a_ids[self.a_bounds[index]:self.a_bounds[index + 1]],
                self.b_ids[self.b_bounds[index]:self.b_bounds[index + 1]])

    def split(self, eval_fraction: float) -> tuple[np.ndarray, np.ndarray]:
        """(train, held-out) pair indices: `split_indices`."""
        return split_indices(len(self), eval_fraction)


def split_indices(n: int, eval_fraction: float) -> tuple[np.ndarray, np.ndarray]:
    """(train, held-out) indices of n pairs: every k-th pair held out, as documents are."""
    n_eval = 0 if eval_fraction == 0 else min(n - 1, max(1, round(n * eval_fraction)))
    held = np.unique(np.linspace(0, n - 1, n_eval).round().astype(np.int64)) if n_eval \
        else np.zeros(0, np.int64)
    is_eval = np.zeros(n, bool)
    is_eval[held] = True
    return np.flatnonzero(~is_eval), np.flatnonzero(is_eval)


def bible_verse_pairs() -> list[tuple[str, str]]:
    """(English, Spanish) verses: the King James Bible and the Reina-Valera 1909, slot by slot
    of their shared KJV versification; a verse empty in either is left out."""
    english = sword_entries(debian_archive.fetch(debian_archive.KJV_BIBLE))
    spanish = sword_entries(debian_archive.fetch(SPANISH_BIBLE))
    if len(english) != len(spanish):
        raise UserError(f"the Bibles have {len(english)} and {len(spanish)} verse slots: not "
                        "one versification")
    pairs = ((osis_text(e), osis_text(s)) for e, s in zip(english, spanish) if e and s)
    return [(e, s) for e, s in pairs if e and s]


def write_bible_texts(directory: str) -> dict[str, int]:
    """The two Bibles as monolingual corpora in the "sentences" layout, a book a document:
    DIRECTORY/en.txt (King James) and DIRECTORY/es.txt (Reina-Valera 1909); words per file."""
    words = {}
    for code, spec in (("en", debian_archive.KJV_BIBLE), ("es", SPANISH_BIBLE)):
        books = [[s for paragraph in book for s in split_sentences(paragraph)]
                 for book in bible_books(debian_archive.fetch(spec))]
        books = [book for book in books if book]
        atomic_files.write_text(os.path.join(directory, f"{code}.txt"), "\n".join(
            "".join(sentence + "\n" for sentence in book) for book in books))
        words[code] = sum(len(sentence.split()) for book in books for sentence in book)
    return words


def write_bible_pairs(output: str) -> int:
    """Writes the verse pairs as tab-separated lines; returns how many."""
    pairs = bible_verse_pairs()
    atomic_files.write_text(output, "".join(f"{e}\t{s}\n" for e, s in pairs))
    return len(pairs)


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bertjax.data.parallel_text",
                                     description="Writes English-Spanish Bible verse pairs "
                                     "(KJV, Reina-Valera 1909) as tab-separated lines, and "
                                     "with --texts each Bible as a monolingual corpus.")
    parser.add_argument("--output", required=True, help="the verse pairs' file")
    parser.add_argument("--texts", help="a directory for en.txt and es.txt (a book a document)")
    parser.error = lambda message: (report(message), sys.exit(EXIT_BAD_INPUT))
    args = parser.parse_args(argv)
    written = [args.output] + ([os.path.join(args.texts, f"{c}.txt") for c in ("en", "es")]
                               if args.texts else [])
    existing = [path for path in written if os.path.exists(path)]
    if existing:
        raise UserError(f"{', '.join(existing)} exist(s); nothing was changed")
    for path in written:
        os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    count = write_bible_pairs(args.output)
    print(f"{count} verse pairs (en, es) in {args.output}", file=sys.stderr)
    if args.texts:
        words = write_bible_texts(args.texts)
        print(f"en.txt ({words['en']} words) and es.txt ({words['es']} words) in {args.texts}",
              file=sys.stderr)


if __name__ == "__main__":
    main(sys.argv[1:])
