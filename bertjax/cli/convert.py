"""Import a Hugging Face BERT checkpoint as bertjax parameters and tokenizer.

    python -m bertjax.convert --from-hf HF_DIR --output DIR

HF_DIR holds config.json and model.safetensors (or pytorch_model.bin, read with
torch.load(weights_only=True)), plus vocab.txt and tokenizer_config.json: what
`save_pretrained` writes, e.g. a downloaded bert-base-uncased. Weight names with or without the
`bert.` prefix are accepted. A RoBERTa or XLM-RoBERTa directory (model_type "roberta" /
"xlm-roberta", its tokenizer.json carried) converts the same way, with RoBERTa's positions
(model.positions_from_padding), an ALBERT directory (model_type "albert") with its factorised
embeddings and shared layers, and a DeBERTa-v2/v3 one (model_type "deberta-v2") with its
disentangled attention (model.position_embedding=relative). DIR is a params export (bertjax.json, params/, tokenizer/) holding
our pretraining model (encoder, MLM and NSP heads); the parts HF_DIR lacks (the heads of a bare
BertModel) are initialized fresh and named on stderr. Start from it with

    python -m bertjax.main --config=configs/base.py --workdir=W \\
        --config.init_checkpoint=DIR --config.model.preset=from_checkpoint ...

(`from_checkpoint` takes the model's shape and vocabulary from DIR). DIR must not exist unless
--overwrite; it appears whole or not at all.
"""

from __future__ import annotations

import argparse
import sys

from bertjax.cli import entry
from bertjax.core import output_dir, storage, transfer
from bertjax.core.errors import UserError
from bertjax.interop import hf_files, hf_models, hf_roberta, params_dir
from bertjax.model.config import EncoderConfig

# What a converted model holds: BertForPretraining(nsp=True) without the SpanBERT head.
CONVERTED_HEADS = {"nsp": True, "sbo": False}
UNTIED_DECODERS = ("cls.predictions.decoder.weight", "lm_head.decoder.weight")


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = entry.ArgumentParser(prog="python -m bertjax.convert",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--from-hf", required=True, dest="from_hf",
                        help="a Hugging Face BERT, RoBERTa, XLM-RoBERTa, ModernBert, ALBERT or "
                        "DeBERTa-v2 directory (config.json + weights)")
    parser.add_argument("--output", required=True, help="the params export to create")
    parser.add_argument("--seed", type=int, default=0,
                        help="seed for the parts the checkpoint lacks")
    parser.add_argument("--no-scan-layers", dest="scan_layers", action="store_false",
                        help="store layers as layer_0..N-1 instead of stacked (either loads)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing DIR")
    return parser.parse_args(argv)


def convert(hf_dir: str, output: str, *, seed: int = 0, scan_layers: bool = True,
            overwrite: bool = False) -> tuple[EncoderConfig, list[str]]:
    """Writes the params export; returns its model and notes on what was initialized or left
    out."""
    output_dir.check_target(output, overwrite=overwrite, kind=params_dir.MODEL_EXPORT,
                            sources=(hf_dir,))
    source = hf_dir
    hf_dir = transfer.local_copy(hf_dir)  # a directory on a bucket: read from this host's copy
    hf_config = hf_files.read_config(hf_dir)
    hf_models.check_architecture(hf_config)  # before reading gigabytes of weights
    tokenizer, notes = hf_files.read_tokenizer(hf_dir)
    imported = hf_models.from_hf(hf_config, hf_files.read_state_dict(hf_dir),
                                 scan_layers=scan_layers, seed=seed)
    check_vocabulary_matches(hf_dir, tokenizer, imported.model.vocab_size)
    if imported.initialized:
        notes.append(f"initialized fresh (not in {hf_dir}): {', '.join(imported.initialized)}")
    if imported.not_imported:
        notes.append(f"not imported (no counterpart in bertjax's pretraining model): "
                     f"{_names(imported.not_imported)}")
    if set(UNTIED_DECODERS) & set(imported.not_imported):
        notes.append(f"{hf_dir} has an MLM decoder that differs from the word embeddings; "
                     "bertjax ties the two, so its MLM scores will differ from this checkpoint's")
    info = {"task": "pretrain", "source": storage.absolute(source), "converted_from": "huggingface",
            "architectures": hf_config.get("architectures") or [],
            "initialized": imported.initialized}
    heads = dict(CONVERTED_HEADS)
    if hf_roberta.is_roberta(hf_config):  # so that an export gives back the same model type
        heads[hf_roberta.HEADS_KEY] = hf_config["model_type"]
    params_dir.save(output, imported.params, imported.model, heads=heads,
                    tokenizer=tokenizer, info=info, overwrite=overwrite, sources=(source,))
    return imported.model, notes


def check_vocabulary_matches(hf_dir: str, tokenizer, embeddings: int) -> None:
    """A BERT vocabulary is the embedding table's row index: token i is row i. More tokens than
    rows cannot be embedded; fewer leave rows that no token reaches, which means another
    vocabulary or a truncated file, and fine-tuning refuses the mismatch. Either is refused here,
    before anything is written, rather than at the first run. It is checked against the
    embedding table itself, not config.json, whose vocab_size may be what is wrong."""
    if tokenizer is None or tokenizer.vocab_size == embeddings:
        return
    relation = "more" if tokenizer.vocab_size > embeddings else "fewer"
    raise UserError(f"{hf_dir}/{hf_files.VOCAB} has {tokenizer.vocab_size} tokens, {relation} "
                    f"than the model's {embeddings} word embeddings: not this model's vocabulary "
                    "(each token must name one embedding row)")


def _names(names: list[str], limit: int = 6) -> str:
    shown = ", ".join(names[:limit])
    return shown + (f" ... ({len(names) - limit} more)" if len(names) > limit else "")


@entry.command
def main(argv: list[str] | None = None) -> None:
    args = _parse_args(argv)
    model, notes = convert(args.from_hf, args.output, seed=args.seed,
                           scan_layers=args.scan_layers, overwrite=args.overwrite)
    for note in notes:
        print(f"bertjax: note: {' '.join(note.split())}", file=sys.stderr)
    print(f"wrote {storage.absolute(args.output)}: {model.num_layers} layers, hidden "
          f"{model.hidden_size}, {model.num_heads} heads, vocabulary {model.vocab_size}")


if __name__ == "__main__":
    main(sys.argv[1:])
