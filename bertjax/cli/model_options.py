"""The command-line options shared by the commands that run a loaded model over texts
(`bertjax.cli.embed`, `bertjax.cli.evaluate similarity`): which model, which layers, batch and length."""

from __future__ import annotations

import argparse

from bertjax.core.errors import UserError
from bertjax.inference import api


def add_to(parser: argparse.ArgumentParser, *, layers: bool = True) -> None:
    parser.add_argument("--model", required=True,
                        help="a workdir, a params export or a Hugging Face BERT directory")
    if layers:
        _add_layers(parser)
    parser.add_argument("--batch-size", type=int, default=32, help="texts per batch")
    parser.add_argument("--max-seq-len", type=int, default=None,
                        help="truncate texts to this many tokens (default: the model's limit)")


def _add_layers(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--layers", default="all",
                        help="all, an index (-1 = the last layer, 0 = the embeddings) or "
                             "comma-separated indices; poolings use the last chosen layer "
                             "(last4_mean: the last four chosen)")


def parse_layers(spec: str):
    """'all', one index ('-1') or a comma-separated list ('0,3,6') -> what `Model.embed` takes."""
    if spec.strip() == "all":
        return "all"
    try:
        indices = [int(part) for part in spec.split(",")]
    except ValueError:
        raise UserError(f"--layers {spec!r}: give all, an index (-1 = the last layer) or "
                        "comma-separated indices (0 = the embeddings)") from None
    return indices[0] if len(indices) == 1 else indices


def load_model(args: argparse.Namespace):
    """The model the parsed options name (UserError if it is not one)."""
    return api.load(args.model, batch_size=args.batch_size, max_seq_len=args.max_seq_len)
