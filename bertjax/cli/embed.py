"""Sentence embeddings of a text file, one text a line, as a float32 [N, H] .npy file; or the
standardisation statistics of a model's vectors on a reference corpus.

    python -m bertjax.embed --model PATH --input FILE --output OUT.npy --pooling mean \\
        [--layers all|-1|0,3,...] [--normalize] [--standardize STATS] [--batch-size N]
        [--max-seq-len N] [--overwrite]
    python -m bertjax.embed --model PATH --fit-standardizer CORPUS --output STATS.npz \\
        [--method zscore|all-but-the-top] [--components D] (--pooling mean | --word-vectors)
        [--layers ...] [--overwrite]

With --standardize, each vector is transformed by the statistics (z-scored, or all-but-the-top;
`bertjax.vectors.standardizer`) before --normalize; the statistics must be of this model, this
pooling and these layers. --fit-standardizer fits them on CORPUS (one text a line); with
--word-vectors on the word vectors of its whitespace-split words (what `Model.word_vectors` and
the sense index compare) instead of pooled sentence vectors.

PATH is anything `bertjax.load` takes (a workdir, a params export, a Hugging Face BERT directory).
Row i of OUT is line i of FILE; a blank line is embedded as an empty text ([CLS] [SEP]) so the rows
stay aligned with the lines, and is counted in a note. Texts longer than the model's limit (or
--max-seq-len) are truncated and counted in a note. OUT's directory must exist; OUT must not exist
unless --overwrite, and appears whole or not at all.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import sys
import time

import numpy as np

from bertjax.cli import entry, model_options
from bertjax.core import output_dir, transfer
from bertjax.core.errors import UserError
from bertjax.inference import standardizing
from bertjax.model.pooling import POOLINGS
from bertjax.vectors import standardizer
from bertjax.vectors.standardizer import ALL_BUT_THE_TOP, METHODS, ZSCORE


def read_texts(path: str) -> list[str]:
    """The lines of a UTF-8 file (without line ends), refused when it holds no text at all."""
    try:
        with open(transfer.local_copy(path), "rb") as f:
            data = f.read()
    except FileNotFoundError:
        raise UserError(f"input file not found: {path}") from None
    except OSError as e:
        raise UserError(f"cannot read {path}: {e.strerror or e}") from None
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not UTF-8 text (byte {e.start})") from None
    # Only "\n" ends a line: str.splitlines would also split on form feeds and U+2028.
    lines = [line.removesuffix("\r") for line in text.split("\n")]
    if lines and lines[-1] == "":
        lines.pop()
    if not any(line.strip() for line in lines):
        raise UserError(f"{path} has no text (one text a line is expected)")
    return lines


def _is_npy(path: str) -> bool:
    try:
        with open(path, "rb") as f:
            return f.read(6) == b"\x93NUMPY"
    except OSError:
        return False


# What embedding writes, and so the only file its --overwrite replaces.
EMBEDDINGS = output_dir.Kind("embeddings file (.npy)", directory=False, holds=_is_npy)


def _inputs(args: argparse.Namespace) -> tuple:
    """What the command reads, which its output must never replace."""
    return (args.input, args.fit_standardizer, args.standardize, args.model)


def _check_output(args: argparse.Namespace) -> None:
    if os.path.isdir(args.output):
        raise UserError(f"{args.output} is a directory; give the .npy file to write")
    output_dir.check_target(args.output, overwrite=args.overwrite, kind=EMBEDDINGS,
                            sources=_inputs(args))


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = entry.ArgumentParser(prog="python -m bertjax.embed",
                                     description=__doc__.split("\n\n")[0])
    source = parser.add_mutually_exclusive_group(required=True)
    source.add_argument("--input", help="a UTF-8 text file, one text a line")
    source.add_argument("--fit-standardizer", dest="fit_standardizer", metavar="CORPUS",
                        help="fit standardisation statistics on CORPUS (one text a line) and "
                             "write them to --output")
    parser.add_argument("--output", required=True, help="the .npy (or statistics .npz) to write")
    parser.add_argument("--pooling", choices=POOLINGS,
                        help="cls: the [CLS] state; mean / max over the tokens; last4_mean: mean "
                             "of the last four layers, then over the tokens")
    parser.add_argument("--normalize", action="store_true", help="scale each vector to length 1")
    parser.add_argument("--standardize", metavar="STATS",
                        help="statistics from --fit-standardizer to transform the vectors by")
    parser.add_argument("--method", choices=METHODS, default=None,
                        help="with --fit-standardizer: zscore (default) or all-but-the-top")
    parser.add_argument("--components", type=int, default=None,
                        help="all-but-the-top: principal components removed (default H/100)")
    parser.add_argument("--word-vectors", action="store_true", dest="word_vectors",
                        help="with --fit-standardizer: statistics of word vectors, not pooled "
                             "sentence vectors")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    model_options.add_to(parser)
    args = parser.parse_args(argv)
    fitting = args.fit_standardizer is not None
    if not fitting and args.pooling is None:
        parser.error("--pooling is required to embed")
    if fitting and args.word_vectors == (args.pooling is not None):
        parser.error("--fit-standardizer needs --pooling (sentence vectors) or --word-vectors")
    if not fitting and (args.word_vectors or args.components is not None or args.method):
        parser.error("--method, --components and --word-vectors go with --fit-standardizer")
    if args.components is not None and args.method != ALL_BUT_THE_TOP:
        parser.error("--components goes with --method all-but-the-top")
    args.method = args.method or ZSCORE
    if fitting and (args.standardize or args.normalize):
        parser.error("--standardize and --normalize go with --input")
    return args


def _fit_standardizer(args: argparse.Namespace, layers) -> None:
    if not args.output.endswith(".npz"):
        raise UserError(f"statistics are written as .npz; give --output a .npz name, not "
                        f"{args.output}")
    standardizer.check_output(args.output, overwrite=args.overwrite, sources=_inputs(args))
    texts = read_texts(args.fit_standardizer)
    model = model_options.load_model(args)
    vectors = standardizing.WORDS if args.word_vectors else standardizing.SENTENCES
    stats = standardizing.fit(model, texts, args.method, vectors=vectors,
                              pooling=args.pooling or "mean", layers=layers,
                              components=args.components,
                              corpus=os.path.abspath(args.fit_standardizer))
    standardizer.save(stats, args.output, overwrite=args.overwrite, sources=_inputs(args))
    what = "word" if args.word_vectors else f"{args.pooling}-pooled sentence"
    print(f"wrote {args.method} statistics of {stats.about['count']} {what} vectors "
          f"(layers {stats.about['layers']}) to {args.output}")


@entry.command
def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    layers = model_options.parse_layers(args.layers)
    if args.fit_standardizer is not None:
        _fit_standardizer(args, layers)
        return
    _check_output(args)
    stats = standardizing.resolve(args.standardize)
    texts = read_texts(args.input)
    with contextlib.ExitStack() as stack:
        # Opened before the model loads: an unwritable directory is found before the work, and
        # the temporary file is removed if anything below fails.
        out = stack.enter_context(output_dir.staged_file(
            args.output, overwrite=args.overwrite, kind=EMBEDDINGS, sources=_inputs(args)))
        model = model_options.load_model(args)
        start = time.perf_counter()
        vectors = model.embed(texts, args.pooling, layers=layers, normalize=args.normalize,
                              standardize=stats)
        seconds = time.perf_counter() - start
        np.save(out, vectors.astype(np.float32, copy=False))
    blank = sum(not text.strip() for text in texts)
    if blank:
        print(f"note: {blank} blank line(s) embedded as empty texts", file=sys.stderr)
    print(f"wrote {vectors.shape[0]} x {vectors.shape[1]} embeddings ({args.pooling} pooling) "
          f"to {args.output} in {seconds:.1f} s ({len(texts) / max(seconds, 1e-9):.1f} texts/s, "
          "compilation included)")


if __name__ == "__main__":
    main(sys.argv[1:])
