"""Document similarity against human judgements: the Lee et al. (2005) corpus (bertjax.evaluation.lee).

    python -m bertjax.evaluate similarity --model PATH [--pooling mean [cls max last4_mean]]
        [--layers all|-1|0,3,...] [--batch-size N] [--max-seq-len N]

For each pooling, the model's cosine similarity of the two documents of every one of the 1,225
pairs is correlated with the pair's mean human rating (Spearman, and Pearson for reference); a
TF-IDF cosine baseline (bertjax.evaluation.tfidf) is scored on the same pairs. Documents longer
than the model's limit (or --max-seq-len) are truncated, and counted.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys

import numpy as np

from bertjax.cli import model_options
from bertjax.evaluation import lee
from bertjax.core.errors import EXIT_BAD_INPUT, exit_on_user_error, report
from bertjax.evaluation import correlation, tfidf
from bertjax.model.pooling import POOLINGS


@dataclasses.dataclass(frozen=True)
class Score:
    method: str
    spearman: float
    pearson: float


def pair_cosines(vectors: np.ndarray, pairs: np.ndarray) -> np.ndarray:
    """Cosine of the rows of each pair [P, 2] of `vectors` [N, H] -> [P]."""
    vectors = np.asarray(vectors, np.float64)
    unit = vectors / np.maximum(np.linalg.norm(vectors, axis=1, keepdims=True), 1e-12)
    return np.sum(unit[pairs[:, 0]] * unit[pairs[:, 1]], axis=1)


def score(method: str, cosines: np.ndarray, ratings: np.ndarray) -> Score:
    return Score(method, correlation.spearman(cosines, ratings),
                 correlation.pearson(cosines, ratings))


def model_scores(model, corpus: lee.LeeCorpus, poolings, layers="all") -> tuple[list[Score], int]:
    """(one Score per pooling, how many documents were truncated)."""
    scores, truncated = [], 0
    for pooling in poolings:
        before = model.truncated  # the same documents are cut for every pooling
        vectors = model.embed(corpus.documents, pooling, layers=layers)
        truncated = model.truncated - before
        scores.append(score(f"model, {pooling} pooling", pair_cosines(vectors, corpus.pairs),
                            corpus.ratings))
    return scores, truncated


def baseline_score(corpus: lee.LeeCorpus) -> Score:
    vectors, implementation = tfidf.vectors(corpus.documents)
    return score(f"TF-IDF cosine ({implementation})", pair_cosines(vectors, corpus.pairs),
                 corpus.ratings)


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bertjax.evaluate similarity",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--pooling", nargs="+", choices=POOLINGS, default=["mean"],
                        help="one or more poolings to score (default: mean)")
    model_options.add_to(parser)
    parser.error = lambda message: (report(message), sys.exit(EXIT_BAD_INPUT))
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    layers = model_options.parse_layers(args.layers)
    corpus = lee.load()
    model = model_options.load_model(args)
    poolings = list(dict.fromkeys(args.pooling))
    scores, truncated = model_scores(model, corpus, poolings, layers)
    scores.append(baseline_score(corpus))
    print(f"Lee et al. (2005): {len(corpus.documents)} documents, {len(corpus.pairs)} pairs "
          f"with mean human ratings; model {args.model} (layers {args.layers})")
    width = max(len(s.method) for s in scores)
    print(f"{'method':<{width}}  Spearman  Pearson")
    for s in scores:
        print(f"{s.method:<{width}}  {s.spearman:8.4f}  {s.pearson:7.4f}")
    print(f"truncated: {truncated} of {len(corpus.documents)} documents to "
          f"{model.max_seq_len} tokens")
