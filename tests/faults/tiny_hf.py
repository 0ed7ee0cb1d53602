"""A small random BERT saved as transformers saves one (config, weights, the real vocabulary):
something to convert, export and embed without a download."""

import torch
from transformers import BertConfig, BertForPreTraining

from hf_reference import randomize, save_hf_dir


def tiny_hf_dir(directory, vocab_path: str) -> str:
    config = BertConfig(vocab_size=30522, hidden_size=32, num_attention_heads=2,
                        intermediate_size=48, num_hidden_layers=2, max_position_embeddings=64,
                        attn_implementation="eager")
    torch.manual_seed(0)
    model = BertForPreTraining(config).eval()
    randomize(model, seed=1)
    return save_hf_dir(directory, model, vocab_path)
