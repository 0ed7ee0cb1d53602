"""A multilingual prepared corpus: one prepared corpus per language under one vocabulary, and the
language of every document.

    DIR/languages.json     written last, atomically: the languages in order and each one's size
    DIR/tokenizer/         the shared vocabulary (what a run records as its tokenizer)
    DIR/lang-<code>/       a prepared corpus (corpus.py's format) of that language's documents

Opened, the languages' shards are one `MultilingualCorpus` (a PreparedCorpus): the documents of
the first language, then the second's, and so on, with `document_languages` the language index of
every document. Each language is prepared by preparation_engine.prepare, so it is resumable and
refused on a fingerprint mismatch as any corpus is.
"""

from __future__ import annotations

import itertools
import json
import os
import re
from typing import Sequence

import numpy as np

from bertjax.core.atomic_files import write_json
from bertjax.data import corpus, preparation_engine
from bertjax.data.inputs import resolve_inputs
from bertjax.data.language_sampling import smoothed_probabilities
from bertjax.data.sources import iter_documents
from bertjax.data.tokenizer import Tokenizer
from bertjax.core.errors import UserError

LANGUAGES_FILE = "languages.json"
FORMAT = "bertjax-multilingual-corpus"
_CODE = re.compile(r"^[a-z][a-z0-9_-]{0,15}$")


def parse_languages(spec: str, name: str = "data.languages") -> dict[str, list[str]]:
    """"en=PATH_OR_GLOB,es=PATH" -> {"en": [...], "es": [...]}; a language may repeat (its
    inputs add up, in order); at least two languages."""
    languages: dict[str, list[str]] = {}
    for part in (p.strip() for p in spec.split(",")):
        if not part:
            continue
        code, sep, path = (s.strip() for s in part.partition("="))
        if not sep or not path or not _CODE.match(code):
            raise UserError(f"{name}: {part!r} is not CODE=PATH (a lowercase language code such "
                            "as en, then a file, directory or glob)")
        languages.setdefault(code, []).append(path)
    if len(languages) < 2:
        raise UserError(f"{name} names {len(languages)} language(s): a multilingual corpus needs "
                        "at least two (e.g. en=en/*.txt,es=es/*.txt)")
    return languages


def language_dir(directory: str, code: str) -> str:
    return os.path.join(directory, f"lang-{code}")


def is_prepared(directory: str) -> bool:
    return os.path.exists(os.path.join(directory, LANGUAGES_FILE))


def check_inputs(languages: dict[str, list[str]]) -> None:
    """Every language's inputs exist and are readable text files (before anything is written)."""
    for code, inputs in languages.items():
        if not resolve_inputs(inputs):
            raise UserError(f"language {code}: no input files in {', '.join(inputs)}")


def vocabulary_sample(languages: dict[str, list[str]], input_format: str, alpha: float,
                      max_sentences: int) -> list[str]:
    """Sentences to train one vocabulary on, drawn with the same smoothing as the batches: up to
    `max_sentences` are read from each language, and language l gives p_l * N of them (p_l from
    the sentence counts read; N the sentences read, at most `max_sentences`), repeated in order
    when it has fewer."""
    read = {}
    for code, inputs in languages.items():
        documents = iter_documents(resolve_inputs(inputs), input_format)
        read[code] = list(itertools.islice(
            (s for document in documents for s in document if s.strip()), max_sentences))
    counts = np.array([len(v) for v in read.values()])
    probabilities = smoothed_probabilities(counts, alpha)
    size = min(max_sentences, int(counts.sum()))
    sample = []
    for (code, sentences), p in zip(read.items(), probabilities):
        wanted = max(1, round(p * size))
        sample += [sentences[i % len(sentences)] for i in range(wanted)]
    return sample


def prepare(languages: dict[str, list[str]], input_format: str, output_dir: str,
            tokenizer: Tokenizer, *, workers: int = 1, progress: bool = True) -> dict:
    """Prepares each language's corpus, then writes languages.json; returns its contents."""
    if is_prepared(output_dir):
        return read_languages(output_dir)
    entries = []
    for code, inputs in languages.items():
        manifest = preparation_engine.prepare(inputs, input_format, language_dir(output_dir, code),
                                              tokenizer, workers=workers, progress=progress)
        entries.append({"code": code, "inputs": inputs, "documents": manifest["documents"],
                        "sentences": manifest["sentences"], "tokens": manifest["tokens"]})
    preparation_engine.save_tokenizer(tokenizer, output_dir)
    record = {"format": FORMAT, "languages": entries}
    write_json(os.path.join(output_dir, LANGUAGES_FILE), record)
    return record


def read_languages(directory: str) -> dict:
    path = os.path.join(directory, LANGUAGES_FILE)
    try:
        with open(path) as f:
            record = json.load(f)
    except (OSError, ValueError) as e:
        raise UserError(f"cannot read {path}: {e}") from None
    if record.get("format") != FORMAT or not record.get("languages"):
        raise UserError(f"{path} is not a {FORMAT} record")
    return record


class MultilingualCorpus(corpus.PreparedCorpus):
    """The languages' corpora as one, with the language of every document."""

    languages: list[str]
    document_languages: np.ndarray  # int64[num_documents]: index into `languages`
    root: str

    @classmethod
    def open(cls, directory: str) -> "MultilingualCorpus":
        record = read_languages(directory)
        parts = [corpus.PreparedCorpus.open(language_dir(directory, e["code"]))
                 for e in record["languages"]]
        tokenizer = parts[0].tokenizer
        for entry, part in zip(record["languages"][1:], parts[1:]):
            if not corpus.same_vocabulary(part.tokenizer, tokenizer):
                raise UserError(f"{language_dir(directory, entry['code'])} was tokenized with "
                                "another vocabulary than the first language's")
        shards = [_shard_arrays(part) for part in parts]
        merged = cls(*(sum((s[i] for s in shards), []) for i in range(3)),
                     np.sum([p.token_counts for p in parts], axis=0), tokenizer, None)
        merged.root = directory
        merged.languages = [e["code"] for e in record["languages"]]
        merged.document_languages = np.repeat(np.arange(len(parts)),
                                              [p.num_documents for p in parts])
        return merged

    def __reduce__(self):
        # Worker processes reopen the corpus rather than receive its memory-mapped tokens.
        return (MultilingualCorpus.open, (self.root,))

    def language_documents(self, documents: np.ndarray, language: int) -> np.ndarray:
        """Those of `documents` in language `language`."""
        documents = np.asarray(documents, np.int64)
        return documents[self.document_languages[documents] == language]

    def language_tokens(self) -> np.ndarray:
        """int64[languages]: tokens per language."""
        sizes = np.diff(self.sentence_bounds[self.document_bounds])
        return np.bincount(self.document_languages, weights=sizes,
                           minlength=len(self.languages)).astype(np.int64)


def _shard_arrays(part: corpus.PreparedCorpus) -> tuple[list, list, list]:
    """A language corpus's shards back as (tokens, sentence bounds, document bounds) lists."""
    manifest = part.manifest
    tokens, sentences, documents = [], [], []
    for shard in manifest["shards"]:
        path = os.path.join(part.directory, corpus.SHARDS_DIR, shard["name"])
        tokens.append(np.load(os.path.join(path, "tokens.npy"), mmap_mode="r"))
        sentences.append(np.load(os.path.join(path, "sentence_bounds.npy")))
        documents.append(np.load(os.path.join(path, "document_bounds.npy")))
    return tokens, sentences, documents


def summary(record: dict, probabilities: Sequence[float] | None = None) -> str:
    lines = []
    for i, e in enumerate(record["languages"]):
        share = f", sampled {probabilities[i]:.3f}" if probabilities is not None else ""
        lines.append(f"  {e['code']}: {e['documents']} documents, {e['tokens']} tokens{share}")
    return "\n".join(lines)
