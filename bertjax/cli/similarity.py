"""`python -m bertjax.evaluate similarity`: a model's document similarity against human judgements
on the Lee et al. (2005) corpus (the computation is `bertjax.evaluation.similarity`'s).

    python -m bertjax.evaluate similarity --model PATH [--pooling mean [cls max last4_mean]]
        [--layers all|-1|0,3,...] [--standardize STATS] [--batch-size N] [--max-seq-len N]

With --standardize (statistics from `python -m bertjax.embed --fit-standardizer`, of the same
pooling and layers) the vectors are standardised before their cosines are taken.
"""

from __future__ import annotations

import argparse

from bertjax.cli import entry, model_options
from bertjax.evaluation import lee
from bertjax.evaluation.similarity import baseline_score, model_scores
from bertjax.inference import standardizing
from bertjax.model.pooling import POOLINGS


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = entry.ArgumentParser(prog="python -m bertjax.evaluate similarity",
                                  description=__doc__.split("\n\n")[0])
    parser.add_argument("--pooling", nargs="+", choices=POOLINGS, default=["mean"],
                        help="one or more poolings to score (default: mean)")
    parser.add_argument("--standardize", metavar="STATS", default=None,
                        help="standardisation statistics applied before the cosine")
    model_options.add_to(parser)
    return parser.parse_args(argv)


@entry.command
def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    layers = model_options.parse_layers(args.layers)
    stats = standardizing.resolve(args.standardize)
    corpus = lee.load()
    model = model_options.load_model(args)
    poolings = list(dict.fromkeys(args.pooling))
    scores, truncated = model_scores(model, corpus, poolings, layers, stats)
    scores.append(baseline_score(corpus))
    print(f"Lee et al. (2005): {len(corpus.documents)} documents, {len(corpus.pairs)} pairs "
          f"with mean human ratings; model {args.model} (layers {args.layers})")
    width = max(len(s.method) for s in scores)
    print(f"{'method':<{width}}  Spearman  Pearson")
    for s in scores:
        print(f"{s.method:<{width}}  {s.spearman:8.4f}  {s.pearson:7.4f}")
    print(f"truncated: {truncated} of {len(corpus.documents)} documents to "
          f"{model.max_seq_len} tokens")
