"""ALBERT-base (Lan et al., 2020; v2 recipe): 128-wide embeddings projected to a 768-wide encoder
whose 12 layers share one layer's parameters (11.7M parameters with a 30,000-token vocabulary,
Hugging Face's AlbertModel count), MLM plus sentence-order prediction
(consecutive segments, swapped half the time, in place of NSP), no dropout, tanh GELU, LAMB at
1.76e-3 on 4,096 sequences of 512 tokens for 125k steps.

    python -m bertjax.main --config=configs/albert.py --workdir=DIR \\
        --config.data.input='corpus/*.txt'
"""

from configs import base


def get_config():
    config = base.get_config()
    config.objective = "albert"
    config.model.embedding_size = 128
    config.model.share_layers = True
    config.model.activation = "gelu_tanh"
    config.model.hidden_dropout = 0.0
    config.model.attention_dropout = 0.0
    config.data.tokenizer_type = "sentencepiece"
    config.data.vocab_size = 30_000
    config.schedule.long_fraction = 1.0
    config.train.steps = 125_000
    config.train.batch_size = 4096
    config.optimizer.name = "lamb"
    config.optimizer.learning_rate = 1.76e-3
    config.optimizer.warmup_steps = 3_125
    return config
