"""Sentence embeddings of a text file, one text a line, as a float32 [N, H] .npy file.

    python -m bertjax.embed --model PATH --input FILE --output OUT.npy --pooling mean \\
        [--layers all|-1|0,3,...] [--normalize] [--batch-size N] [--max-seq-len N] [--overwrite]

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
from bertjax.core.atomic_files import replacing
from bertjax.core.errors import UserError
from bertjax.model.pooling import POOLINGS


def read_texts(path: str) -> list[str]:
    """The lines of a UTF-8 file (without line ends), refused when it holds no text at all."""
    try:
        with open(path, "rb") as f:
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


def _check_output(output: str, input_path: str, overwrite: bool) -> None:
    if os.path.isdir(output):
        raise UserError(f"{output} is a directory; give the .npy file to write")
    if os.path.exists(output) and not overwrite:
        raise UserError(f"{output} already exists; choose a new output or pass --overwrite")
    if os.path.exists(input_path) and os.path.realpath(output) == os.path.realpath(input_path):
        raise UserError(f"the output {output} would replace the input; choose another output")
    directory = os.path.dirname(os.path.abspath(output))
    if not os.path.isdir(directory):
        raise UserError(f"cannot write {output}: {directory} is not an existing directory")


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = entry.ArgumentParser(prog="python -m bertjax.embed",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--input", required=True, help="a UTF-8 text file, one text a line")
    parser.add_argument("--output", required=True, help="the .npy file to write")
    parser.add_argument("--pooling", required=True, choices=POOLINGS,
                        help="cls: the [CLS] state; mean / max over the tokens; last4_mean: mean "
                             "of the last four layers, then over the tokens")
    parser.add_argument("--normalize", action="store_true", help="scale each vector to length 1")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    model_options.add_to(parser)
    return parser.parse_args(argv)


@entry.command
def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    layers = model_options.parse_layers(args.layers)
    _check_output(args.output, args.input, args.overwrite)
    texts = read_texts(args.input)
    with contextlib.ExitStack() as stack:
        # Opened before the model loads: an unwritable directory is found before the work, and
        # the temporary file is removed if anything below fails.
        try:
            out = stack.enter_context(replacing(args.output, "wb"))
        except OSError as e:
            raise UserError(f"cannot write {args.output}: {e.strerror or e}") from None
        model = model_options.load_model(args)
        start = time.perf_counter()
        vectors = model.embed(texts, args.pooling, layers=layers, normalize=args.normalize)
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
