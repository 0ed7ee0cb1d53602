"""Export a checkpoint's parameters (no optimizer state) for fine-tuning or for Hugging Face.

    python -m bertjax.export --workdir DIR --format params --output OUT
    python -m bertjax.export --workdir DIR --format hf --output OUT
    python -m bertjax.export --workdir DIR --format adapters --output OUT
    python -m bertjax.export --workdir DIR --format hf --merge-lora --output OUT

DIR is a pretraining or fine-tuning workdir (its latest checkpoint, or --step N) or a params
export. `params` writes bertjax's params-only format (OUT/bertjax.json, OUT/params,
OUT/tokenizer), which `--config.init_checkpoint=OUT` starts a run from. `hf` writes config.json,
model.safetensors and the tokenizer files (vocab.txt, tokenizer_config.json,
special_tokens_map.json) that transformers' `from_pretrained(OUT)` loads: BertForPreTraining for
a pretraining run (BertForMaskedLM without NSP), BertForSequenceClassification,
BertForTokenClassification or BertForQuestionAnswering for a fine-tuned one; an ELECTRA run
becomes ElectraForPreTraining (the discriminator) in OUT and ElectraForMaskedLM (the generator)
in OUT/generator; a converted RoBERTa / XLM-RoBERTa becomes (XLM)RobertaForMaskedLM again, a
DeBERTa model DebertaV2ForMaskedLM (an ELECTRA run on DeBERTa its discriminator as
DebertaV2Model). What has no Hugging
Face counterpart (the SpanBERT head, a CRF, a SentencePiece vocabulary) is named on stderr.
OUT must not exist unless --overwrite; it appears whole or not at all.

An adapter or LoRA run (finetune.method=adapter|lora): `adapters` writes only what it trained
(adapters or LoRA, LayerNorms for adapters, the head) with a reference to its base (the init
checkpoint), which `bertjax.load(OUT)` and --config.init_checkpoint=OUT put back underneath.
`--merge-lora` folds LoRA into the query and value weights, a plain BERT again (hf or params).
The Hugging Face export of a LoRA run needs it (refused without: merging is not undone), and that
of an adapter run is refused (adapters have no Hugging Face BERT counterpart).
"""

from __future__ import annotations

import argparse
import os
import sys

from bertjax.cli import entry
from bertjax.core import output_dir, storage
from bertjax.core.errors import UserError
from bertjax.inference import loading
from bertjax.interop import adapters_dir, hf_electra, hf_files, hf_models, hf_roberta, params_dir
from bertjax.model import adaptation

FORMATS = ("params", "hf", "adapters")
# What a params export keeps of the source's record (the rest describes the source run); an
# adapter / LoRA run's method and base let the export itself be exported as adapters later.
_RECORD_KEYS = ("task", "step", "source", "method", "init_checkpoint")


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = entry.ArgumentParser(prog="python -m bertjax.export",
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
    parser.add_argument("--merge-lora", action="store_true",
                        help="fold a LoRA run's updates into the base weights (hf, params)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing OUT")
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


def _check_adaptation(source: str, fmt: str, model, merge_lora: bool) -> None:
    """Refuses, before anything is read, what an adapter / LoRA run (or its absence) forbids."""
    if merge_lora and fmt == "adapters":
        raise UserError("--merge-lora makes a plain model, --format adapters keeps LoRA apart "
                        "from its base: use one of them")
    if merge_lora and not model.lora_rank:
        raise UserError(f"--merge-lora: {source} has no LoRA parameters (not a "
                        "finetune.method=lora run)")
    if fmt == "adapters" and not adapters_dir.is_adapted(model):
        raise UserError(f"{source} has no adapters or LoRA (not a finetune.method=adapter|lora "
                        "run); export it with --format params")
    if fmt == "hf" and model.adapter_size:
        raise UserError(f"{source} is an adapter run, and adapters have no Hugging Face BERT "
                        "counterpart; export it with --format adapters or params")
    if fmt == "hf" and model.lora_rank and not merge_lora:
        raise UserError(f"{source} is a LoRA run: its Hugging Face export needs --merge-lora "
                        "(folds the low-rank updates into the query and value weights)")


def _base_of(source: str, bundle: loading.Loaded) -> str:
    base = (bundle.record.get("base", {}).get("path") if bundle.kind == loading.ADAPTERS
            else bundle.record.get("init_checkpoint"))
    if not base or "method" not in bundle.record:
        raise UserError(f"{source} does not record the base it adapts (run.json's "
                        "init_checkpoint and method)")
    return base


def export(source: str, fmt: str, output: str, *, step: int | None = None, tokenizer: str = "",
           overwrite: bool = False, merge_lora: bool = False) -> list[str]:
    """Writes the export; returns warnings about what did not carry over."""
    if fmt not in FORMATS:
        raise UserError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")
    if not storage.exists(source):
        raise UserError(f"checkpoint not found: {source}")
    output_dir.check_target(output, overwrite=overwrite, kind=params_dir.MODEL_EXPORT,
                            sources=(source, tokenizer))
    _check_adaptation(source, fmt, loading.describe(source).require_encoder(), merge_lora)
    bundle = loading.load(source, step)
    model, params = bundle.require_encoder(), bundle.params
    if merge_lora:
        params, model = adaptation.merge_lora(params, model)
    vocabulary = source_tokenizer(bundle, tokenizer)
    warnings = [] if vocabulary else [f"{source} records no tokenizer that still exists; the "
                                      "export has none (pass --tokenizer PATH)"]
    record = {k: bundle.info[k] for k in _RECORD_KEYS if k in bundle.info}
    if fmt == "adapters":
        adapters_dir.save(output, params, model, heads=bundle.heads,
                          method={"name": bundle.record["adaptation"]["method"],
                                  "fresh": bundle.record["adaptation"]["fresh"]},
                          base=_base_of(source, bundle),
                          tokenizer=vocabulary, info=record, overwrite=overwrite,
                          sources=(source, tokenizer))
        return warnings
    if fmt == "params":
        if merge_lora:
            record.pop("method", None)  # a plain model now
        params_dir.save(output, params, model, heads=bundle.heads,
                        tokenizer=vocabulary, info=record, overwrite=overwrite,
                        sources=(source, tokenizer))
        return warnings
    # An ELECTRA run is two models: the discriminator in OUT, the generator in a subdirectory.
    models = (hf_electra.to_hf(params, model, bundle.heads) if hf_electra.is_electra(bundle.heads)
              else {"": hf_models.to_hf(params, model, bundle.heads)})
    notes = [note for hf in models.values() for note in hf.notes]
    with output_dir.staged(output, overwrite=overwrite, kind=params_dir.MODEL_EXPORT,
                           sources=(source, tokenizer)) as staging:
        for subdir, hf in models.items():
            directory = os.path.join(staging, subdir)
            os.makedirs(directory, exist_ok=True)
            config = hf.config
            if vocabulary is not None and hf_roberta.is_roberta(config):
                # A text is framed by the vocabulary's own [CLS]/<s> and [SEP]/</s>.
                config = {**config, "bos_token_id": vocabulary.special.cls,
                          "eos_token_id": vocabulary.special.sep}
            hf_files.write_model(directory, config, hf.state_dict)
            if vocabulary is not None:
                note = hf_files.write_tokenizer(
                    directory, vocabulary, bundle.encoder.max_sequence_length,
                    fast=hf.config.get("model_type") == "modernbert",
                    albert=hf.config.get("model_type") == "albert")
                notes += [note] if note and not subdir else []
    return notes + warnings


@entry.command
def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    warnings = export(args.workdir, args.format, args.output, step=args.step,
                      tokenizer=args.tokenizer, overwrite=args.overwrite,
                      merge_lora=args.merge_lora)
    for warning in warnings:
        print(f"bertjax: warning: {' '.join(warning.split())}", file=sys.stderr)
    kind = {"hf": "Hugging Face", "params": "params-only", "adapters": "adapters"}[args.format]
    print(f"wrote the {kind} export {storage.absolute(args.output)}")


if __name__ == "__main__":
    main(sys.argv[1:])
