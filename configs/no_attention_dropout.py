"""BERT-base pretraining without dropout on the attention probabilities, as MosaicBERT and
ModernBERT train: every training step then takes jax.nn.dot_product_attention, the call a
backend fuses (cuDNN flash attention on a GPU with model.dtype=bfloat16 and
model.attention_implementation=cudnn), instead of spelling out the [B, N, T, T] probabilities to
drop some. Hidden dropout stays. Fine-tuning takes the same switch:
--config.model.attention_dropout=0.0."""

from configs import base


def get_config():
    config = base.get_config()
    config.model.attention_dropout = 0.0
    return config
