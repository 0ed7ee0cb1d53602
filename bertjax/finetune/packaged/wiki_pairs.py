"""A retrieval set from real Wikipedia text: the inverse cloze task (Lee et al., 2019, ORQA) on the
106 English Wikipedia articles of gensim's MediaWiki sample (`packaged.WIKIPEDIA_SAMPLE`, the
source of the demo corpus), read with their real paragraph breaks.

Every paragraph of 3 to 12 sentences gives one query: one of its sentences of at least 5 words,
drawn with a seed; its document is the paragraph without that sentence. Paragraphs (and queries)
seen before are skipped, so every document and query text is unique. Whole articles go to one
split, by a CRC-32 of the title (`finetune.examples.split_of`: buckets 0-7 train, 8 dev, 9
test), so no article has paragraphs in two splits. Query qNNNNN's relevant document is dNNNNN.

    python -m bertjax.retrieval.wiki_pairs --output DIR [--seed 0]

DIR must not exist; it appears whole or not at all. Files (UTF-8; *.jsonl: one JSON object a
line, in article order):

    train.jsonl, dev.jsonl, test.jsonl      the dual encoder's rows (configs/finetune_retrieval.py)
        {"id": "q00017", "query": "...", "positive": "...", "negative": "...",
         "doc_id": "d00017", "negative_id": "d00021", "title": "Anarchism"}
        negative: a hard negative, the document of another paragraph of the same article (of
        another article of the split when the article has one paragraph)
    corpus.jsonl                            every document of every split
        {"id": "d00017", "text": "...", "title": "Anarchism", "split": "train"}
    train_queries.jsonl, dev_queries.jsonl, test_queries.jsonl
        {"id": "q00017", "text": "...", "relevant": ["d00017"]}
    train_queries.txt, dev_queries.txt, test_queries.txt
        the same queries' texts, one a line, in the same order
    pairs_train.tsv, pairs_dev.tsv, pairs_test.tsv     cross-encoder pairs in GLUE's MRPC layout,
        which configs/finetune_pair.py reads with no column flags (#1 = query, #2 = passage):
        Quality<TAB>#1 ID<TAB>#2 ID<TAB>#1 String<TAB>#2 String
        per query three rows: its positive (1), its hard negative (0), and a document of another
        article of the split drawn with the seed (0)
    manifest.json   {"source", "seed", "splits": {split: {"articles", "queries", "pair_rows"}}}

`packaged:wiki_retrieval:SPLIT` reads the same rows (seed 0) without writing files.
"""

from __future__ import annotations

import argparse
import bz2
import collections
import dataclasses
import functools
import json
import os
import random
import sys

from bertjax.core import output_dir, packaged
from bertjax.core.errors import EXIT_BAD_INPUT, UserError, exit_on_user_error, report
from bertjax.data import wikitext
from bertjax.data.sentence_splitting import split_sentences
from bertjax.finetune.examples import TextExample, split_of

SPLITS = ("train", "dev", "test")
MIN_SENTENCES, MAX_SENTENCES = 3, 12
MIN_QUERY_WORDS = 5
PAIR_HEADER = ("Quality", "#1 ID", "#2 ID", "#1 String", "#2 String")
# Written once into the cache and never replaced (overwrite is never asked for).
DATASET = output_dir.Kind("wiki pairs dataset", directory=True,
                          holds=lambda path: os.path.isfile(os.path.join(path, "corpus.jsonl")))


@dataclasses.dataclass(frozen=True)
class Pair:
    """One query and its document (dNNNNN of qNNNNN), with its hard negative's document id."""

    number: int
    title: str
    split: str
    query: str
    document: str
    negative: int = -1  # the number of the hard negative's pair

    @property
    def id(self) -> str:
        return f"q{self.number:05d}"

    @property
    def doc_id(self) -> str:
        return f"d{self.number:05d}"


def _clean(text: str) -> str:
    return " ".join(text.split())  # one line, no tabs: safe in TSV and line-based files


def _articles():
    dump = packaged.fetch(packaged.WIKIPEDIA_SAMPLE)
    try:
        with bz2.open(dump, "rb") as stream:
            yield from wikitext.iter_articles(stream, collections.Counter(), dump)
    except (OSError, EOFError) as e:
        raise UserError(f"cannot read {dump}: {e}") from None


@functools.lru_cache(maxsize=4)
def build(seed: int = 0) -> tuple[Pair, ...]:
    """Every pair of every split, numbered in article order, with hard negatives drawn."""
    pairs: list[Pair] = []
    seen: set[str] = set()
    for article in _articles():
        split = split_of(article.title)
        for index, paragraph in enumerate(article.paragraphs):
            sentences = [_clean(s) for s in split_sentences(paragraph)]
            candidates = [i for i, s in enumerate(sentences) if len(s.split()) >= MIN_QUERY_WORDS]
            if not MIN_SENTENCES <= len(sentences) <= MAX_SENTENCES or not candidates:
                continue
            # Seeded per paragraph (a string seed hashes with SHA-512): the draw depends on
            # neither the order of the dump nor the Python hash seed.
            chosen = random.Random(f"{seed}:{article.title}:{index}").choice(candidates)
            query = sentences[chosen]
            document = " ".join(s for i, s in enumerate(sentences) if i != chosen)
            if query in seen or document in seen:
                continue
            seen.update((query, document))
            pairs.append(Pair(len(pairs), article.title, split, query, document))
    if not pairs:
        raise UserError("the Wikipedia sample gave no paragraph to build queries from")
    return tuple(_with_negatives(pairs, seed))


def _with_negatives(pairs: list[Pair], seed: int) -> list[Pair]:
    by_article, by_split = collections.defaultdict(list), collections.defaultdict(list)
    for p in pairs:
        by_article[p.title].append(p.number)
        by_split[p.split].append(p.number)
    out = []
    for p in pairs:
        rng = random.Random(f"{seed}:negative:{p.number}")
        # Another article of the split only where the paragraph's own has no other: that list is
        # the split's length, too costly to build for every pair.
        choices = [n for n in by_article[p.title] if n != p.number] or [
            n for n in by_split[p.split] if pairs[n].title != p.title]
        out.append(dataclasses.replace(p, negative=rng.choice(choices) if choices else -1))
    return out


def split_pairs(split: str, seed: int = 0) -> list[Pair]:
    if split not in SPLITS:
        raise UserError(f"unknown split {split!r}; choose one of {', '.join(SPLITS)}")
    return [p for p in build(seed) if p.split == split]


def examples(split: str, seed: int = 0) -> list[TextExample]:
    """The split as fine-tuning examples (query, positive, hard negative): what
    `packaged:wiki_retrieval:SPLIT` reads."""
    every = build(seed)
    return [TextExample(p.id, p.query, p.document, None,
                        every[p.negative].document if p.negative >= 0 else None)
            for p in split_pairs(split, seed)]


def _row(p: Pair, every: tuple[Pair, ...]) -> dict:
    negative = every[p.negative] if p.negative >= 0 else None
    return {"id": p.id, "query": p.query, "positive": p.document,
            "negative": negative.document if negative else "",
            "doc_id": p.doc_id, "negative_id": negative.doc_id if negative else "",
            "title": p.title}


def _pair_rows(pairs: list[Pair], every: tuple[Pair, ...], seed: int) -> list[tuple]:
    rows = []
    for p in pairs:
        rows.append(("1", p.id, p.doc_id, p.query, p.document))
        if p.negative >= 0:
            rows.append(("0", p.id, every[p.negative].doc_id, p.query, every[p.negative].document))
        if any(q.title != p.title for q in pairs):
            rng = random.Random(f"{seed}:pair:{p.number}")
            other = rng.choice(pairs)
            while other.title == p.title:
                other = rng.choice(pairs)
            rows.append(("0", p.id, other.doc_id, p.query, other.document))
    return rows


def write(output: str, seed: int = 0) -> dict:
    """Writes the files above into `output` (which must not exist); returns the manifest."""
    every = build(seed)
    manifest = {"source": "gensim " + packaged.WIKIPEDIA_SAMPLE[1].rsplit("/", 1)[-1],
                "seed": seed, "splits": {}}
    with output_dir.staged(output, overwrite=False, kind=DATASET) as staging:
        def lines(name: str, records) -> None:
            with open(os.path.join(staging, name), "w", encoding="utf-8") as f:
                f.writelines(json.dumps(r, ensure_ascii=False) + "\n" for r in records)

        lines("corpus.jsonl", ({"id": p.doc_id, "text": p.document, "title": p.title,
                                "split": p.split} for p in every))
        for split in SPLITS:
            pairs = [p for p in every if p.split == split]
            lines(f"{split}.jsonl", (_row(p, every) for p in pairs))
            lines(f"{split}_queries.jsonl", ({"id": p.id, "text": p.query,
                                              "relevant": [p.doc_id]} for p in pairs))
            with open(os.path.join(staging, f"{split}_queries.txt"), "w", encoding="utf-8") as f:
                f.writelines(p.query + "\n" for p in pairs)
            rows = _pair_rows(pairs, every, seed)
            with open(os.path.join(staging, f"pairs_{split}.tsv"), "w", encoding="utf-8") as f:
                f.writelines("\t".join(row) + "\n" for row in [PAIR_HEADER, *rows])
            manifest["splits"][split] = {"articles": len({p.title for p in pairs}),
                                         "queries": len(pairs), "pair_rows": len(rows)}
        with open(os.path.join(staging, "manifest.json"), "w", encoding="utf-8") as f:
            json.dump(manifest, f, indent=1)
    return manifest


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bertjax.retrieval.wiki_pairs",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="the directory to create")
    parser.add_argument("--seed", type=int, default=0, help="the query and negative draws")
    parser.error = lambda message: (report(message), sys.exit(EXIT_BAD_INPUT))
    args = parser.parse_args(argv)
    manifest = write(args.output, args.seed)
    counts = ", ".join(f"{split} {c['queries']} queries ({c['articles']} articles)"
                       for split, c in manifest["splits"].items())
    print(f"wrote {os.path.abspath(args.output)}: {counts}")


if __name__ == "__main__":
    main(sys.argv[1:])
