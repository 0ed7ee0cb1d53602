"""`python -m bertjax.evaluate anisotropy`: how anisotropic a model's contextual embeddings are,
per layer, raw and after z-scoring or all-but-the-top (the computation is
`bertjax.evaluation.anisotropy`'s).

    python -m bertjax.evaluate anisotropy --model PATH --corpus FILE [--sentences 1000]
        [--plot OUT.png] [--json OUT.json] [--components D] [--seed 0] [--overwrite]

FILE holds one sentence a line (blank lines are skipped); the first --sentences are used.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os

from bertjax.cli import entry, model_options
from bertjax.cli.embed import read_texts
from bertjax.core import output_dir
from bertjax.core.errors import UserError
from bertjax.evaluation import anisotropy


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = entry.ArgumentParser(prog="python -m bertjax.evaluate anisotropy",
                                  description=__doc__.split("\n\n")[0])
    parser.add_argument("--corpus", required=True, help="a UTF-8 text file, one sentence a line")
    parser.add_argument("--sentences", type=int, default=1000,
                        help="how many of its sentences to use (default 1000)")
    parser.add_argument("--plot", default=None, help="draw the measures per layer into this PNG")
    parser.add_argument("--json", default=None, help="write the figures as JSON here")
    parser.add_argument("--components", type=int, default=None,
                        help="all-but-the-top: principal components removed (default H/100)")
    parser.add_argument("--seed", type=int, default=0, help="for the random token pairs")
    parser.add_argument("--overwrite", action="store_true", help="replace --plot / --json")
    model_options.add_to(parser, layers=False)
    return parser.parse_args(argv)


def _starts_with(magic: bytes):
    def holds(path: str) -> bool:
        try:
            with open(path, "rb") as f:
                return f.read(len(magic)) == magic
        except OSError:
            return False
    return holds


# What --plot and --json write, and so the only files --overwrite replaces.
PLOT = output_dir.Kind("PNG image", directory=False, holds=_starts_with(b"\x89PNG"))
REPORT = output_dir.Kind("JSON report", directory=False, holds=_starts_with(b"{"))


def _outputs(args: argparse.Namespace):
    return (("--plot", args.plot, ".png", PLOT), ("--json", args.json, ".json", REPORT))


def _check_outputs(args: argparse.Namespace) -> None:
    if args.plot is not None and args.json is not None and \
            os.path.abspath(args.plot) == os.path.abspath(args.json):
        raise UserError("--plot and --json name the same file")
    for flag, path, suffix, kind in _outputs(args):
        if path is None:
            continue
        if not path.endswith(suffix):
            raise UserError(f"{flag} {path}: give a {suffix} file")
        output_dir.check_target(path, overwrite=args.overwrite, kind=kind,
                                sources=(args.corpus, args.model))


@entry.command
def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    if args.sentences < 2:
        raise UserError(f"--sentences must be at least 2, got {args.sentences}")
    _check_outputs(args)
    texts = [t for t in read_texts(args.corpus) if t.strip()][:args.sentences]
    if len(texts) < 2:
        raise UserError(f"{args.corpus} has fewer than 2 sentences; anisotropy compares tokens "
                        "of different sentences")
    model = model_options.load_model(args)
    states = anisotropy.token_states(model, texts)
    results = anisotropy.measure(states, components=args.components, seed=args.seed)
    words = results["raw"][0].words
    print(f"anisotropy of {model.path}: {len(states.sentences)} tokens of {len(texts)} sentences "
          f"from {args.corpus}; self-similarity over {words} words seen in 2+ sentences")
    print(anisotropy.table(results))
    if args.json:
        with output_dir.staged_file(args.json, overwrite=args.overwrite, kind=REPORT,
                                    sources=(args.corpus, args.model), mode="w") as f:
            json.dump({"model": model.path, "corpus": os.path.abspath(args.corpus),
                       "sentences": len(texts), "tokens": len(states.sentences),
                       "layers": {variant: [dataclasses.asdict(g) for g in per_layer]
                                  for variant, per_layer in results.items()}}, f, indent=2)
            f.write("\n")
    if args.plot:
        with output_dir.staged_file(args.plot, overwrite=args.overwrite, kind=PLOT,
                                    sources=(args.corpus, args.model)) as f:
            anisotropy.plot(results, f, f"{model.path}: {len(texts)} sentences")
        print(f"wrote {args.plot}")
