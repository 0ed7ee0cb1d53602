"""Build, search and evaluate a vector index: `python -m bertjax.index COMMAND ...`.

    python -m bertjax.index build --model PATH --corpus docs.jsonl --output INDEX \\
        [--pooling mean] [--standardize STATS] [--approximate] [--overwrite]
    python -m bertjax.index search --index INDEX --queries q.txt|q.jsonl --k 10 \\
        [--exact|--approximate] [--rerank RUN --rerank-k 50] [--report-recall] \\
        [--output results.jsonl] [--model PATH]
    python -m bertjax.index evaluate --index INDEX --queries q.jsonl [--bm25] \\
        [--rerank RUN --rerank-k 50] [--model PATH]   (search and evaluate: [--standardize STATS])

PATH is any model `bertjax.load` reads; STATS standardisation statistics from `python -m
bertjax.embed --fit-standardizer` (an index built with them is searched with the same file); RUN
a fine-tuned pair-classification run (the cross-encoder). Search is exact (a jitted matmul and
top-k over every vector) unless --approximate asks for the FAISS HNSW index built with `build
--approximate`. It writes one JSON line per query, {"id", "query", "results": [{"id",
"score"[, "dense_score"]}]}, to --output (never over an existing file without --overwrite) or stdout. A --k larger than the
corpus returns the whole corpus with a warning. Evaluate prints Recall@1, Recall@10, MRR@10
and nDCG@10 per method, and the recall of the approximate top 10 against the exact top 10.
Bad input is one line on stderr and exit status 2.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from bertjax.cli import entry
from bertjax.core import output_dir, storage
from bertjax.core.errors import UserError
from bertjax.inference import standardizing
from bertjax.inference.api import load
from bertjax.retrieval import evaluation, metrics
from bertjax.retrieval.index import build as build_index
from bertjax.retrieval.index import embed_queries, open_index, query_model, require_standardizer
from bertjax.retrieval.inputs import read_queries
from bertjax.retrieval.rerank import CrossEncoder
from bertjax.retrieval.search import APPROXIMATE, EXACT, clamped, ranked


def _parser() -> argparse.ArgumentParser:
    parser = entry.ArgumentParser(prog="python -m bertjax.index",
                                  description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)

    build = commands.add_parser("build", help="embed a corpus into a new index")
    build.add_argument("--model", required=True, help="the encoder (any path bertjax.load reads)")
    build.add_argument("--corpus", required=True, help="jsonl: one {\"id\", \"text\"} a line")
    build.add_argument("--output", required=True, help="the index directory to create")
    build.add_argument("--pooling", default="mean", help="cls | mean | max | last4_mean")
    build.add_argument("--standardize", metavar="STATS", default=None,
                       help="standardise the vectors by these statistics before normalising")
    build.add_argument("--approximate", action="store_true",
                       help="also build the approximate (FAISS HNSW) index")
    build.add_argument("--overwrite", action="store_true", help="replace an existing index")

    for name, text in (("search", "the top k documents of each query"),
                       ("evaluate", "ranking metrics on queries with relevant document ids")):
        command = commands.add_parser(name, help=text)
        command.add_argument("--index", required=True)
        command.add_argument("--queries", required=True,
                             help=".txt (one a line) or .jsonl ({\"id\", \"text\", \"relevant\"})")
        command.add_argument("--model", default=None,
                             help="the index's model at another path (refused if it differs)")
        command.add_argument("--rerank", default=None, metavar="RUN",
                             help="a fine-tuned pair-classification run that re-scores the "
                                  "dense top --rerank-k")
        command.add_argument("--rerank-k", type=int, default=50, dest="rerank_k")
        command.add_argument("--standardize", metavar="STATS", default=None,
                             help="the statistics the index was built with (required then)")
        command.add_argument("--positive-label", default="", dest="positive_label",
                             help="the cross-encoder's relevant label (default: its second)")
        if name == "search":
            command.add_argument("--k", type=int, default=10)
            method = command.add_mutually_exclusive_group()
            method.add_argument("--exact", dest="method", action="store_const", const="exact")
            method.add_argument("--approximate", dest="method", action="store_const",
                                const="approximate")
            command.add_argument("--report-recall", action="store_true", dest="report_recall",
                                 help="also search exactly and report the approximate recall")
            command.add_argument("--output", default=None, help="results jsonl (default stdout)")
            command.add_argument("--overwrite", action="store_true")
        else:
            command.add_argument("--bm25", action="store_true", help="add the BM25 baseline")
    for command in commands.choices.values():
        command.add_argument("--batch-size", type=int, default=32, dest="batch_size")
    return parser


def load_model(path: str, step: int | None = None, batch_size: int = 32):
    """A model for the index commands (`bertjax.retrieval` takes its models from here: it sits
    below the Python API)."""
    return load(path, step=step, batch_size=batch_size)


def _loader(args):
    """The `retrieval.index.ModelLoader` of these arguments."""
    return lambda path, step: load_model(path, step, args.batch_size)


def _build(args) -> None:
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, got {args.batch_size}")
    stats = standardizing.resolve(args.standardize)
    manifest = build_index(args.model, args.corpus, args.output, _loader(args),
                           pooling=args.pooling, with_approximate=args.approximate,
                           overwrite=args.overwrite, standardizer=stats)
    if manifest["truncated"]:
        print(f"note: {manifest['truncated']} document(s) were truncated to "
              f"{manifest['max_seq_len']} tokens", file=sys.stderr)
    print(f"wrote the index {storage.absolute(args.output)}: {manifest['documents']} documents, "
          f"{manifest['dim']}-dimensional {manifest['pooling']}-pooled vectors")
    if manifest["approximate"]:
        sample = manifest["approximate"]["recall_at_build"]
        print(f"approximate ({manifest['approximate']['library']} "
              f"{manifest['approximate']['kind']}) vs exact top {sample['k']}: recall "
              f"{sample['recall']:.4f} on {sample['queries']} stored vectors as queries")


def _common(args, *, relevant: bool):
    """The index, queries and checks every search or evaluation makes before loading a model."""
    if args.batch_size < 1:
        raise UserError(f"--batch-size must be at least 1, got {args.batch_size}")
    index = open_index(args.index)
    require_standardizer(index, standardizing.resolve(args.standardize))
    queries = read_queries(args.queries, relevant=relevant)
    if args.rerank is not None and args.rerank_k < 1:
        raise UserError(f"--rerank-k must be at least 1, got {args.rerank_k}")
    return index, queries


def _models(index, args):
    """The cross-encoder first (a wrong run fails before the queries are embedded), then the
    query model."""
    cross_encoder = (CrossEncoder(load_model(args.rerank, batch_size=args.batch_size),
                                  args.positive_label) if args.rerank is not None else None)
    return cross_encoder, query_model(index, _loader(args), args.model)


def _search(args) -> None:
    index, queries = _common(args, relevant=False)
    method = args.method or EXACT
    if args.k < 1:
        raise UserError(f"--k must be at least 1, got {args.k}")
    if args.rerank is not None and args.rerank_k < args.k:
        raise UserError(f"--rerank-k ({args.rerank_k}) must be at least --k ({args.k}): only "
                        "re-ranked candidates are returned")
    if method == APPROXIMATE or args.report_recall:
        index.approximate_index()  # refused now (no graph, or no FAISS), not after embedding
    if args.output is not None:
        _check_output(args)
    cross_encoder, model = _models(index, args)
    # Warned only now: a refused command prints its one error line and nothing else.
    k = clamped(args.k, index.size)
    rerank_k = clamped(args.rerank_k, index.size, "--rerank-k") if args.rerank else 0
    texts = [q.text for q in queries]
    vectors = embed_queries(index, model, texts)
    result = ranked(index, texts, vectors, k, method=method, cross_encoder=cross_encoder,
                    rerank_k=rerank_k)
    if args.report_recall:
        other = EXACT if method == APPROXIMATE else APPROXIMATE
        first = ranked(index, texts, vectors, k, method=method).rows
        second = ranked(index, texts, vectors, k, method=other).rows
        exact_rows, approximate_rows = (first, second) if method == EXACT else (second, first)
        print(f"approximate vs exact top {k}: recall "
              f"{metrics.overlap_recall(approximate_rows, exact_rows):.4f} over {len(queries)} "
              "queries", file=sys.stderr)
    lines = []
    for q, query in enumerate(queries):
        hits = [{"id": index.documents[row].id, "score": round(score, 6)}
                for row, score in zip(result.rows[q], result.scores[q])]
        if result.first_stage is not None:
            for hit, dense_score in zip(hits, result.first_stage[q]):
                hit["dense_score"] = round(dense_score, 6)
        lines.append(json.dumps({"id": query.id, "query": query.text, "results": hits},
                                ensure_ascii=False) + "\n")
    if args.output is None:
        sys.stdout.writelines(lines)
        return
    with output_dir.staged_file(args.output, overwrite=args.overwrite, kind=RANKINGS,
                                sources=_inputs(args), mode="w") as f:
        f.writelines(lines)
    print(f"wrote {len(queries)} rankings to {args.output}", file=sys.stderr)


def _is_rankings(path: str) -> bool:
    """A file `search --output` wrote: JSON lines with "results" (or nothing: no queries)."""
    try:
        with open(path, encoding="utf-8") as f:
            first = f.readline()
        return not first or "results" in json.loads(first)
    except (OSError, UnicodeDecodeError, ValueError, TypeError):
        return False


# What `search --output` writes, and so the only file its --overwrite replaces.
RANKINGS = output_dir.Kind("rankings file (from index search --output)", directory=False,
                           holds=_is_rankings)


def _inputs(args) -> tuple:
    """What a search reads, which its output must never replace."""
    return (args.index, args.queries, args.model, args.rerank, args.standardize)


def _check_output(args) -> None:
    if os.path.isdir(args.output):
        raise UserError(f"{args.output} is a directory; give the file to write")
    output_dir.check_target(args.output, overwrite=args.overwrite, kind=RANKINGS,
                            sources=_inputs(args))


def _evaluate(args) -> None:
    index, queries = _common(args, relevant=True)
    evaluation.check_relevant(index, queries)
    evaluation.check_rankers(index, bm25=args.bm25)
    cross_encoder, model = _models(index, args)
    report_ = evaluation.evaluate(index, queries, model, bm25=args.bm25,
                                  cross_encoder=cross_encoder, rerank_k=args.rerank_k)
    print(f"{report_['queries']} queries, {index.size} documents, model "
          f"{index.manifest['model']['path']} ({index.manifest['pooling']} pooling)")
    print(evaluation.table(report_))
    if report_["approximate_recall"] is not None:
        print(f"approximate vs exact top {min(evaluation.DEPTH, index.size)}: recall "
              f"{report_['approximate_recall']:.4f}")
    else:
        print("no approximate index (build with --approximate to compare it)")


@entry.command
def main(argv: list[str] | None = None) -> None:
    args = _parser().parse_args(argv)
    {"build": _build, "search": _search, "evaluate": _evaluate}[args.command](args)


if __name__ == "__main__":
    main(sys.argv[1:])
