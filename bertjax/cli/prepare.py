"""`python -m bertjax.data.prepare`: prepares a corpus from the command line (the work itself is
preparation_engine.py's).

    python -m bertjax.data.prepare --input 'corpus/*.txt.gz' --format sentences --output DIR \
        [--vocab vocab.txt | --train-vocab wordpiece --vocab-size 30522] [--workers 8]
        [--runner direct|dataflow|flink|spark BEAM_OPTIONS...]

With --runner the same preparation runs as an Apache Beam pipeline (data/beam_preparation.py);
the flags this command does not know are that pipeline's options.
"""

from __future__ import annotations

import argparse
import os
import sys

from bertjax.cli import entry
from bertjax.core import storage, transfer
from bertjax.core.errors import UserError
from bertjax.data import beam_storage, corpus
from bertjax.data.beam_preparation import RUNNERS, BeamWriter
from bertjax.data.preparation_engine import DEFAULT_DOCUMENTS_PER_SHARD, prepare
from bertjax.data.sources import DEFAULT_MAX_LINE_CHARS, FORMATS
from bertjax.data.tokenizer import Tokenizer, load_tokenizer
from bertjax.data.tokenizer_training import TOKENIZER_KINDS, build_tokenizer
from bertjax.jobs import remote_inputs

DEFAULT_VOCAB_SIZE = 30522


def summary(manifest: dict, output_dir: str) -> str:
    source = manifest.get("source", {})
    skipped = source.get("skipped_lines", {})
    skipped_text = ", ".join(f"{k}={v}" for k, v in skipped.items()) or "none"
    return (f"prepared {output_dir}: {manifest['documents']} documents, {manifest['sentences']} "
            f"sentences, {manifest['tokens']} tokens in {len(manifest['shards'])} shards, "
            f"{manifest.get('tokens_per_sec', 0):.0f} tokens/s; skipped lines: {skipped_text}")


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = entry.ArgumentParser(prog="python -m bertjax.data.prepare",
                                     description="Tokenizes a text corpus into shards, once.")
    parser.add_argument("--input", required=True,
                        help="files, directories or globs, comma-separated")
    parser.add_argument("--format", default="sentences", choices=FORMATS)
    parser.add_argument("--output", required=True, help="directory for the prepared corpus")
    vocab = parser.add_mutually_exclusive_group()
    vocab.add_argument("--vocab", help="vocab.txt, SentencePiece .model, or a tokenizer directory")
    vocab.add_argument("--train-vocab", choices=TOKENIZER_KINDS, default="wordpiece",
                       help="train this kind of tokenizer on the corpus (when --vocab is absent)")
    parser.add_argument("--vocab-size", type=int, default=None,
                        help=f"size of the vocabulary to train (default {DEFAULT_VOCAB_SIZE})")
    parser.add_argument("--max-train-sentences", type=int, default=10_000_000)
    parser.add_argument("--cased", action="store_true", help="keep case and accents")
    parser.add_argument("--workers", type=int, default=None,
                        help="processes that tokenize (default: one per core; without --runner)")
    parser.add_argument("--runner", choices=RUNNERS,
                        help="prepare as an Apache Beam pipeline on this runner (the beam extra); "
                             "flags this command does not know are the pipeline's options")
    parser.add_argument("--documents-per-shard", type=int, default=DEFAULT_DOCUMENTS_PER_SHARD)
    parser.add_argument("--max-line-chars", type=int, default=DEFAULT_MAX_LINE_CHARS)
    parser.add_argument("--no-progress", action="store_true")
    args, beam_flags = parser.parse_known_args(argv)
    if beam_flags and args.runner is None:
        raise UserError(f"unrecognized arguments: {' '.join(beam_flags)}")
    if args.runner is not None and args.workers is not None:
        raise UserError("--workers is for preparation on this machine; with --runner, set the "
                        "runner's own (--direct_num_workers, --num_workers, ...)")
    args.beam_flags = beam_flags
    return args


def _beam_writer(args: argparse.Namespace, specs: list[str]) -> BeamWriter | None:
    """The pipeline's writer, its options checked, before anything is written; None without
    --runner. Its workers read the inputs and write the output where they are: object URLs
    (fetched and uploaded by each worker), or filesystem paths they all see."""
    if args.runner is None:
        return None
    writer = BeamWriter(args.runner, args.beam_flags)
    local = [p for p in [args.output, *specs] if not storage.is_url(p)]
    if args.runner == "dataflow" and local:
        raise UserError(f"Dataflow's workers see Cloud Storage only: --input and --output must "
                        f"be gs:// URLs, not {local[0]}")
    return writer


def _inputs(specs: list[str], distributed: BeamWriter | None) -> list[str]:
    """The inputs as the preparation reads them: URLs as local copies on this host, unless a
    pipeline's workers read them (then each object's URL, globs and prefixes expanded)."""
    if distributed is None:
        return transfer.local_inputs(specs)
    return [found for spec in specs for found in
            (beam_storage.input_urls([spec]) if storage.is_url(spec) else [spec])]


def _cli_tokenizer(args: argparse.Namespace, inputs: list[str], notes: list[str]) -> Tokenizer:
    if args.vocab:
        return load_tokenizer(transfer.local_copy(args.vocab),
                              lowercase=False if args.cased else None)
    saved = os.path.join(args.output, corpus.TOKENIZER_DIR)
    if os.path.isdir(saved):
        # Resuming or re-running: training again could give another vocabulary.
        tokenizer = load_tokenizer(saved)
        if tokenizer.kind != args.train_vocab or tokenizer.lowercase == args.cased:
            raise UserError(f"{args.output} holds a {tokenizer.kind} tokenizer "
                            f"({'uncased' if tokenizer.lowercase else 'cased'}) trained earlier; "
                            "choose another output directory for another kind")
        notes.append(f"using the tokenizer trained earlier in {saved}")
        return tokenizer
    # trained on this host: inputs named by URL through local copies
    return build_tokenizer(transfer.local_inputs(inputs), args.format, args.train_vocab, _vocab_size(args),
                           lowercase=not args.cased, max_sentences=args.max_train_sentences,
                           max_line_chars=args.max_line_chars)


def _vocab_size(args: argparse.Namespace) -> int:
    return DEFAULT_VOCAB_SIZE if args.vocab_size is None else args.vocab_size


def _local_output(url: str, distributed: BeamWriter | None) -> str:
    """Where a corpus for `url` is prepared on this host (a pipeline's shards: by its workers,
    straight into the bucket), to be uploaded, the manifest last; a finished one's copy."""
    storage.check_output_url(url, "a prepared corpus")
    if distributed is not None:
        distributed.output_url = storage.absolute(url)
    if not storage.exists(storage.join(url, corpus.MANIFEST)):
        return transfer.working_copy(url)
    # A pipeline's finished corpus is checked by its manifest, plan and tokenizer: its shards
    # (the whole corpus) stay on the bucket.
    on_bucket = (lambda name: False) if distributed is None else \
        (lambda name: name.startswith(corpus.SHARDS_DIR + "/"))
    return transfer.local_copy(url, skip=on_bucket)


@entry.command
def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    specs = [spec.strip() for spec in args.input.split(",") if spec.strip()]
    distributed = _beam_writer(args, specs)
    target = args.output
    if storage.is_url(target):
        args.output = _local_output(target, distributed)
    inputs = _inputs(specs, distributed)
    # Before a vocabulary is trained: an output prepared otherwise must not silently win.
    notes = [f"bertjax: warning: {' '.join(warning.split())}" for warning in
             corpus.check_prepared_matches(
                 args.output, tokenizer_spec=args.vocab or "", vocab_size=_vocab_size(args),
                 explicit=args.vocab_size is not None, lowercase=False if args.cased else None)]
    tokenizer = _cli_tokenizer(args, inputs, notes)

    def print_notes() -> None:  # once every refusal is decided: a refused command prints one line
        for note in notes:
            print(note, file=sys.stderr)

    manifest = prepare(inputs, args.format, args.output, tokenizer,
                       documents_per_shard=args.documents_per_shard, workers=args.workers,
                       progress=not args.no_progress, max_line_chars=args.max_line_chars,
                       on_start=print_notes, distributed=distributed)
    if storage.is_url(target) and not storage.exists(storage.join(target, corpus.MANIFEST)):
        remote_inputs.upload_corpus(args.output, target)
        if distributed is not None:  # its shards are on the bucket only: this copy is no corpus
            storage.remove(args.output)
    print(summary(manifest, target))


if __name__ == "__main__":
    main(sys.argv[1:])
