"""The `make demo` run: a small BERT pretrained on 106 real Wikipedia articles, on a CPU, in a few
minutes, with both phases of the BERT length schedule (scaled down), evaluation on held-out
articles, checkpoints and a plot of the curves.

    python -m bertjax.main --config=configs/demo.py --workdir=workdir/demo
"""

from configs import base


def get_config():
    config = base.get_config()
    config.data.input = "demo:wikipedia"
    config.data.vocab_size = 4096
    config.data.eval_fraction = 0.05
    config.model.preset = "tiny"
    # A few hundred steps leave a tiny model far from overfitting: dropout would only slow it.
    config.model.hidden_dropout = 0.0
    config.model.attention_dropout = 0.0
    config.schedule.short_seq_len = 128
    config.schedule.short_max_predictions = 20
    config.schedule.long_seq_len = 256
    config.schedule.long_max_predictions = 40
    config.train.steps = 600
    config.train.batch_size = 32
    config.train.log_every = 20
    config.train.checkpoint_every = 200
    config.train.eval_every = 100
    config.train.eval_batches = 8
    config.train.plot = True
    config.optimizer.learning_rate = 2e-3
    config.optimizer.warmup_steps = 60
    config.optimizer.bias_correction = True
    return config
