"""A tiny BERT (L=2, H=128) for development and tests: minutes on a laptop CPU.

    python -m bertjax.main --config=configs/tiny.py --workdir=DIR --config.data.input='corpus/*.txt'
"""

from configs import base


def get_config():
    config = base.get_config()
    config.model.preset = "tiny"
    config.data.vocab_size = 8192
    config.schedule.short_seq_len = 64
    config.schedule.short_max_predictions = 10
    config.schedule.long_seq_len = 128
    config.schedule.long_max_predictions = 20
    config.train.steps = 200
    config.train.batch_size = 16
    config.train.log_every = 10
    config.train.checkpoint_every = 100
    config.train.eval_every = 100
    config.train.eval_batches = 4
    config.optimizer.learning_rate = 1e-3
    config.optimizer.warmup_steps = 20
    return config
