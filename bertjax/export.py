"""Export a checkpoint's parameters (no optimizer state) for fine-tuning or for Hugging Face.

    python -m bertjax.export --workdir DIR --format params --output OUT
    python -m bertjax.export --workdir DIR --format hf --output OUT

DIR is a pretraining or fine-tuning workdir (its latest checkpoint, or --step N) or a params
export. `params` writes bertjax's params-only format (OUT/bertjax.json, OUT/params,
OUT/tokenizer), which `--config.init_checkpoint=OUT` starts a run from. `hf` writes config.json,
model.safetensors and the tokenizer files (vocab.txt, tokenizer_config.json,
special_tokens_map.json) that transformers' `from_pretrained(OUT)` loads: BertForPreTraining for
a pretraining run (BertForMaskedLM without NSP), BertForSequenceClassification,
BertForTokenClassification or BertForQuestionAnswering for a fine-tuned one. What has no Hugging
Face counterpart (the SpanBERT head, a CRF, a SentencePiece vocabulary) is named on stderr.
OUT must not exist unless --overwrite; it appears whole or not at all.
"""

from __future__ import annotations

import argparse
import os
import sys

from bertjax import loading
from bertjax.errors import EXIT_BAD_INPUT, UserError, exit_on_user_error, report
from bertjax.interop import hf_files, hf_models, output_dir, params_dir
from bertjax.library_logs import quiet_routine_library_logs

FORMATS = ("params", "hf")
# What a params export keeps of the source's record (the rest describes the source run).
_RECORD_KEYS = ("task", "step", "source")


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bertjax.export",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--workdir", required=True,
                        help="a pretraining or fine-tuning workdir, or a params export")
    parser.add_argument("--format", required=True, choices=FORMATS,
                        help="params: bertjax's params-only format; hf: Hugging Face layout")
    parser.add_argument("--output", required=True, help="the directory to create")
    parser.add_argument("--step", type=int, default=None,
                        help="the checkpoint step to export (default: the latest)")
    parser.add_argument("--tokenizer", default="",
                        help="the vocabulary to ship (default: the one the run recorded)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
    parser.error = lambda message: (report(message), sys.exit(EXIT_BAD_INPUT))
    return parser.parse_args(argv)


def source_tokenizer(loaded: loading.Loaded, override: str):
    """The vocabulary to ship: `override`, or the one the source recorded (None if it is gone)."""
    if not override and not loaded.has_tokenizer:
        return None
    tokenizer = loaded.tokenizer(override)
    model = loaded.require_encoder()
    if tokenizer.vocab_size > model.vocab_size:
        raise UserError(f"the tokenizer {override or loaded.tokenizer_dir} has "
                        f"{tokenizer.vocab_size} tokens, more than the model's "
                        f"{model.vocab_size} embeddings: not this model's vocabulary")
    return tokenizer


def export(source: str, fmt: str, output: str, *, step: int | None = None, tokenizer: str = "",
           overwrite: bool = False) -> list[str]:
    """Writes the export; returns warnings about what did not carry over."""
    if fmt not in FORMATS:
        raise UserError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if not os.path.exists(source):
        raise UserError(f"checkpoint not found: {source}")
    output_dir.check_target(output, overwrite=overwrite, sources=(source,))
    bundle = loading.load(source, step)
    bundle.require_encoder()
    vocabulary = source_tokenizer(bundle, tokenizer)
    warnings = [] if vocabulary else [f"{source} records no tokenizer that still exists; the "
                                      "export has none (pass --tokenizer PATH)"]
    if fmt == "params":
        record = {k: bundle.info[k] for k in _RECORD_KEYS if k in bundle.info}
        params_dir.save(output, bundle.params, bundle.encoder, heads=bundle.heads,
                        tokenizer=vocabulary, info=record, overwrite=overwrite)
        return warnings
    model = hf_models.to_hf(bundle.params, bundle.encoder, bundle.heads)
    with output_dir.staged(output, overwrite=overwrite) as staging:
        hf_files.write_model(staging, model.config, model.state_dict)
        if vocabulary is not None:
            note = hf_files.write_tokenizer(staging, vocabulary,
                                            bundle.encoder.max_position_embeddings)
            warnings += [note] if note else []
    return model.notes + warnings


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    quiet_routine_library_logs()
    warnings = export(args.workdir, args.format, args.output, step=args.step,
                      tokenizer=args.tokenizer, overwrite=args.overwrite)
    for warning in warnings:
        print(f"bertjax: warning: {' '.join(warning.split())}", file=sys.stderr)
    kind = "Hugging Face" if args.format == "hf" else "params-only"
    print(f"wrote the {kind} export {os.path.abspath(args.output)}")


if __name__ == "__main__":
    main(sys.argv[1:])
