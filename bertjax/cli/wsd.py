"""python -m bertjax.wsd evaluate | fit | predict (see `bertjax.wsd`)."""

from __future__ import annotations

import argparse
import sys

from bertjax.cli import entry
from bertjax.core import output_dir, storage
from bertjax.core.errors import UserError
from bertjax.data import demo_corpus
from bertjax.inference import loading, standardizing
from bertjax.inference.api import load
from bertjax.wsd import wordnet
from bertjax.wsd.evaluation import corpus_frequencies, evaluate
from bertjax.wsd.index import SENSE_INDEX, SenseIndex, layers_record


def _layers_arg(text: str):
    if text == "all":
        return text
    try:
        values = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"--layers takes 'all', an index or comma-separated indices (-4,-3,-2,-1), got "
            f"{text!r}") from None
    return values[0] if len(values) == 1 else values


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = entry.ArgumentParser(prog="python -m bertjax.wsd",
                                  description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    evaluate_cmd = commands.add_parser("evaluate", help="held-out WordNet accuracy vs the "
                                       "most-frequent-sense baseline")
    fit_cmd = commands.add_parser("fit", help="fit a sense index on WordNet's examples")
    predict_cmd = commands.add_parser("predict", help="the sense of a word in a sentence")
    for sub in (evaluate_cmd, fit_cmd):
        sub.add_argument("--model", required=True,
                         help="a workdir, params export or Hugging Face BERT directory")
        sub.add_argument("--layers", type=_layers_arg, default=-1,
                         help="hidden states to average: an index or indices (default -1, the "
                         "last layer; -4,-3,-2,-1 for the mean of the last four)")
        sub.add_argument("--batch-size", type=int, default=32)
    for sub in (evaluate_cmd, fit_cmd, predict_cmd):
        sub.add_argument("--standardize", metavar="STATS", default=None,
                         help="word-vector statistics (`python -m bertjax.embed "
                         "--fit-standardizer CORPUS --word-vectors`) applied before comparing")
    evaluate_cmd.add_argument("--lemmas", type=int, default=50,
                              help="the N ambiguous lemmas with the most examples (default 50)")
    evaluate_cmd.add_argument("--all-lemmas", action="store_true",
                              help="every ambiguous lemma (871)")
    evaluate_cmd.add_argument("--holdout", type=int, default=3,
                              help="hold out one example in k of each sense (default 3)")
    fit_cmd.add_argument("--output", required=True, help="the index directory to create")
    fit_cmd.add_argument("--lemmas", type=int, default=None,
                         help="only the N lemmas with the most examples (default: all)")
    fit_cmd.add_argument("--overwrite", action="store_true", help="replace an existing index")
    predict_cmd.add_argument("--index", required=True, help="a directory made by `fit`")
    predict_cmd.add_argument("--sentence", required=True)
    predict_cmd.add_argument("--word", required=True,
                             help="the word to disambiguate (its first occurrence, or of a form "
                             "of it: --word bank finds 'banks')")
    predict_cmd.add_argument("--model", default=None,
                             help="the model (default: the one the index was fitted with)")
    return parser.parse_args(argv)


def _load_model(args):
    return load(args.model, batch_size=getattr(args, "batch_size", 32))


def _lines(path: str):
    with open(path, encoding="utf-8") as f:
        yield from f


def _evaluate(args) -> None:
    lemmas = None if args.all_lemmas else args.lemmas
    # Refused before WordNet is read (seconds): the same checks `split` makes.
    if args.holdout < 2:
        raise UserError(f"holdout must be at least 2 (one example in k held out), got "
                        f"{args.holdout}")
    if lemmas is not None and lemmas < 1:
        raise UserError(f"lemmas must be positive, got {lemmas}")
    examples = wordnet.read_examples()
    dataset = wordnet.split(examples, lemmas=lemmas, holdout=args.holdout)
    stats = standardizing.resolve(args.standardize)
    model = _load_model(args)
    result = evaluate(model, dataset, args.layers, stats)
    print(f"WordNet 3.0 example sentences: {len(dataset.lemmas)} ambiguous lemmas, "
          f"{len(dataset.senses)} senses, {len(dataset.train)} training and {len(dataset.test)} "
          f"held-out examples (one in {args.holdout} per sense)")
    print(f"model {model.path}, layers {layers_record(args.layers)}")
    print(f"{'lemma':<16}{'senses':>7}{'held out':>10}{'1-NN':>8}{'MFS':>8}")
    for lemma, (senses, count, hits, base) in result.per_lemma().items():
        print(f"{lemma:<16}{senses:>7}{count:>10}{hits / count:>8.3f}{base / count:>8.3f}")
    frequency = corpus_frequencies(_lines(demo_corpus.demo_corpus_path()), dataset.lemmas)
    for name, (lemmas, count, hits, base) in result.by_frequency(frequency).items():
        if count:
            print(f"{name} lemmas ({lemmas}, by their count in the Wikipedia demo corpus): 1-NN "
                  f"{hits / count:.4f}, most frequent sense {base / count:.4f} ({count} held out)")
    right, base = sum(result.nearest), sum(result.baseline)
    print(f"1-NN accuracy {result.accuracy(result.nearest):.4f} ({right}/{len(dataset.test)}); "
          f"most-frequent-sense baseline {result.accuracy(result.baseline):.4f} "
          f"({base}/{len(dataset.test)})")


def _fit(args) -> None:
    output_dir.check_target(args.output, overwrite=args.overwrite, kind=SENSE_INDEX,
                            sources=(args.model, args.standardize))
    if args.lemmas is not None and args.lemmas < 1:  # before WordNet is read (seconds)
        raise UserError(f"--lemmas must be positive, got {args.lemmas}")
    chosen = wordnet.ambiguous_lemmas(wordnet.read_examples(), min_examples=1)
    if args.lemmas is not None:
        chosen = dict(list(chosen.items())[:args.lemmas])
    examples = [e for senses in chosen.values() for found in senses.values() for e in found]
    stats = standardizing.resolve(args.standardize)
    index = SenseIndex.fit(_load_model(args), examples, args.layers, stats)
    index.save(args.output, overwrite=args.overwrite)
    print(f"wrote the sense index {storage.absolute(args.output)}: {len(index.lemmas)} lemmas, "
          f"{len(index.senses)} senses from {len(examples)} WordNet examples")


def _predict(args) -> None:
    index = SenseIndex.load(args.index, None if args.model is None else _load_model(args),
                            standardizing.resolve(args.standardize))
    words = wordnet.words_of(args.sentence)
    position, lemma = index.locate(words, args.word)
    ranked = index.rank(words, position, lemma)
    best, score = ranked[0]
    print(f"{best.id}\t{score:.4f}\t{best.definition}")
    for sense, score in ranked[1:]:
        print(f"  {sense.id}\t{score:.4f}\t{sense.definition}")


@entry.command
def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    if getattr(args, "batch_size", 1) < 1:
        raise UserError(f"--batch-size must be positive, got {args.batch_size}")
    if args.model is not None:
        loading.kind_of(args.model)  # "not a model" before WordNet is read
    {"evaluate": _evaluate, "fit": _fit, "predict": _predict}[args.command](args)


if __name__ == "__main__":
    main(sys.argv[1:])
