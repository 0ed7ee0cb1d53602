"""ELECTRA (Clark et al., 2020): replaced token detection. A generator a quarter of the
discriminator's width (a masked LM over the 15% masked tokens) and the discriminator (BERT-base)
are trained jointly; the generator's samples replace the masked tokens and the discriminator
tells every token original or replaced. loss = MLM(generator) + 50 * RTD(discriminator). The
embeddings are shared; fine-tuning and export start from the discriminator.

    python -m bertjax.main --config=configs/electra.py --workdir=DIR \
        --config.data.input='corpus/*.txt'
"""

from configs import base


def get_config():
    config = base.get_config()
    config.objective = "electra"
    # The generator: base.py's electra section (0 sizes: the paper's quarter-width one).
    # ELECTRA-base's recipe: 766k steps of 256 sequences of 512 tokens, Adam 2e-4, 10k warmup.
    config.schedule.long_fraction = 1.0
    config.train.steps = 766_000
    config.optimizer.learning_rate = 2e-4
    config.optimizer.bias_correction = True
    return config
