"""A retrieval set from the real Wikipedia demo articles (built at test time, nothing committed).

Each article is cut into passages of consecutive sentences; one sentence of each passage (a
seeded choice among those of at least 8 words) becomes a query and is taken out of its passage,
so the query's one relevant document is the paragraph it came from, without the sentence itself
(the inverse cloze task: lexical copying does not solve it, topical understanding helps). Every
passage is a document of the corpus.

    python tests/retrieval_pairs.py OUTDIR [--sentences 4] [--held-out-every 5]

writes OUTDIR/docs.jsonl (all passages), OUTDIR/queries.jsonl (the queries of held-out articles:
every 5th article), and for a cross-encoder OUTDIR/pairs_train.tsv and pairs_dev.tsv (query,
passage, label 1/0: for each query of the other articles its own passage, a passage of the same
article and one of another article; dev: a tenth of those articles).
"""

from __future__ import annotations

import argparse
import json
import os
import random

MIN_QUERY_WORDS = 8


def sentence_passages(articles: list[list[str]], sentences: int = 4, seed: int = 0,
                      per_article: int = 0) -> tuple[list[dict], list[dict]]:
    """(documents [{"id", "text", "article"}], queries [{"id", "text", "relevant", "article"}])."""
    rng = random.Random(seed)
    documents, queries = [], []
    for a, article in enumerate(articles):
        windows = [article[i:i + sentences] for i in range(0, len(article), sentences)]
        windows = [w for w in windows if len(w) == sentences]
        for p, window in enumerate(windows[:per_article or None]):
            choices = [i for i, s in enumerate(window) if len(s.split()) >= MIN_QUERY_WORDS]
            if not choices:
                continue
            chosen = rng.choice(choices)
            doc_id = f"a{a}-p{p}"
            documents.append({"id": doc_id, "article": a, "text": " ".join(
                s for i, s in enumerate(window) if i != chosen)})
            queries.append({"id": f"q-{doc_id}", "text": window[chosen], "relevant": [doc_id],
                            "article": a})
    return documents, queries


def cross_encoder_pairs(queries: list[dict], documents: list[dict], seed: int = 0
                        ) -> list[tuple[str, str, str]]:
    """(query, passage, "1"/"0"): each query with its own passage, one of its article and one
    of another article."""
    rng = random.Random(seed)
    by_id = {d["id"]: d for d in documents}
    by_article: dict[int, list[dict]] = {}
    for d in documents:
        by_article.setdefault(d["article"], []).append(d)
    rows = []
    for q in queries:
        own = by_id[q["relevant"][0]]
        rows.append((q["text"], own["text"], "1"))
        same = [d for d in by_article[q["article"]] if d["id"] != own["id"]]
        if same:
            rows.append((q["text"], rng.choice(same)["text"], "0"))
        other = rng.choice(documents)
        if other["article"] != q["article"]:
            rows.append((q["text"], other["text"], "0"))
    return rows


def write_jsonl(path: str, records: list[dict], keys: tuple[str, ...]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.writelines(json.dumps({k: r[k] for k in keys}, ensure_ascii=False) + "\n"
                     for r in records)


def write_pairs(path: str, rows: list[tuple[str, str, str]]) -> None:
    with open(path, "w", encoding="utf-8") as f:
        f.write("query\tpassage\tlabel\n")
        f.writelines("\t".join(" ".join(c.split()) for c in row) + "\n" for row in rows)


def main() -> None:
    from bertjax.data.demo_corpus import demo_corpus_path

    parser = argparse.ArgumentParser()
    parser.add_argument("output")
    parser.add_argument("--sentences", type=int, default=4)
    parser.add_argument("--held-out-every", type=int, default=5, dest="every")
    args = parser.parse_args()
    with open(demo_corpus_path(), encoding="utf-8") as f:
        articles = [d.split("\n") for d in f.read().strip().split("\n\n")]
    documents, queries = sentence_passages(articles, args.sentences)
    os.makedirs(args.output, exist_ok=True)
    write_jsonl(os.path.join(args.output, "docs.jsonl"), documents, ("id", "text"))
    held_out = [q for q in queries if q["article"] % args.every == 0]
    write_jsonl(os.path.join(args.output, "queries.jsonl"), held_out, ("id", "text", "relevant"))
    training = [q for q in queries if q["article"] % args.every != 0]
    dev = [q for q in training if q["article"] % (10 * args.every) == 1]
    train = [q for q in training if q["article"] % (10 * args.every) != 1]
    write_pairs(os.path.join(args.output, "pairs_train.tsv"), cross_encoder_pairs(train, documents))
    write_pairs(os.path.join(args.output, "pairs_dev.tsv"), cross_encoder_pairs(dev, documents, 1))
    print(f"{len(documents)} documents, {len(held_out)} held-out queries, {len(train)} training "
          f"and {len(dev)} dev queries for the cross-encoder in {args.output}")


if __name__ == "__main__":
    main()
