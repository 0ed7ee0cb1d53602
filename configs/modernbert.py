"""ModernBERT-base (Warner et al., 2024) on bertjax's pretraining machinery.

The architecture: rotary positions (theta 160,000 in the global layers, 10,000 in the local
ones), pre-norm with a norm after the embeddings and after the last layer, GeGLU (up projection
2 x 1,152), no biases in the dense layers or the norms, every third layer global (layer 0 first)
and the others a 128-token sliding window; no segment embeddings, no NSP. The recipe: MLM only
on full sentences packed without cross-document attention at 1,024 tokens with 30% masking, StableAdamW and a
warmup-stable-decay schedule. ModernBERT's context extension (8,192 tokens, the global layers'
rotary base raised from 10,000 to 160,000) is the long phase of the length schedule: set
`schedule.long_fraction` to the share of steps it takes.

    python -m bertjax.main --config=configs/modernbert.py --workdir=DIR \
        --config.data.input='corpus/*.txt'
"""

from configs import base


def set_architecture(config) -> None:
    """ModernBERT's architecture on any preset (shared by the large config and small runs)."""
    model = config.model
    model.position_embedding = "rope"
    model.rope_theta = 160_000.0  # the global layers'; the local ones keep the default 10,000
    model.norm = "pre"
    model.mlp = "geglu"
    model.use_bias = False
    model.norm_bias = False
    model.global_attention_every = 3
    model.sliding_window = 128
    model.type_vocab_size = 0
    model.layer_norm_eps = 1e-5
    model.hidden_dropout = 0.0
    model.attention_dropout = 0.0
    model.max_position_embeddings = 8192


def get_config():
    config = base.get_config()
    config.model.preset = "modernbert_base"
    set_architecture(config)
    config.objective = "roberta"
    config.data.separate_documents = True
    config.masking.mask_prob = 0.3
    config.schedule.short_seq_len = 1024
    config.schedule.short_max_predictions = 320
    config.schedule.long_seq_len = 8192
    config.schedule.long_max_predictions = 2496
    config.schedule.long_fraction = 0.0
    config.schedule.short_rope_theta = 10_000.0  # raised to model.rope_theta for 8,192 tokens
    config.data.vocab_size = 50368
    config.train.batch_size = 4608
    # StableAdamW (update clipping per tensor instead of global-norm clipping), weight decay
    # fully decoupled from the rate as optimi does (hence its small value), warmup-stable-decay
    # with a 1-sqrt cooldown over the last 10% of the steps (optimizer.decay_fraction's default).
    config.optimizer.name = "stable_adamw"
    config.optimizer.learning_rate = 8e-4
    config.optimizer.warmup_steps = 3_000
    config.optimizer.b2 = 0.98
    config.optimizer.weight_decay = 1e-5
    config.optimizer.fully_decoupled_weight_decay = True
    config.optimizer.bias_correction = True
    config.optimizer.clip_norm = 0.0
    config.optimizer.decay = "wsd_sqrt"
    return config
