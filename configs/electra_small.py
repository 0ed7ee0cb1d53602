"""ELECTRA on a small discriminator (L=4, H=512, BERT's "small" miniature) with a generator of a
quarter of its width (H=128, 2 heads): a few hours on one accelerator. See configs/electra.py.

    python -m bertjax.main --config=configs/electra_small.py --workdir=DIR \
        --config.data.input='corpus/*.txt'

`--config.model.preset=tiny` (H=128, generator H=32) makes it a development size.
"""

from configs import electra


def get_config():
    config = electra.get_config()
    config.model.preset = "small"
    config.schedule.long_fraction = 0.1       # base.py's 128 tokens, then 512 for the last 10%
    config.train.steps = 100_000
    config.train.batch_size = 128
    config.train.checkpoint_every = 5_000
    config.train.eval_every = 5_000
    config.optimizer.learning_rate = 5e-4
    return config
