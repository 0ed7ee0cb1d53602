"""The `make demo` run: configs/budget.py's recipe (MLM on full sentences, 30% masking, no dropout,
the learning rate laid over a wall-clock budget) on real English prose (Wikipedia and
public-domain books, fetched from the package registries), for 3 minutes on a CPU, evaluated on
held-out documents, checkpointed every minute, curves plotted; it ends by filling in a few
[MASK]s with the trained model.

    python -m bertjax.main --config=configs/demo.py --workdir=workdir/demo
"""

from configs import budget


def get_config():
    config = budget.get_config()
    # In 3 minutes BERT-tiny reaches a higher MLM accuracy than the recipe's mini (12.6% against
    # 8.8% after 4 minutes, docs/pretraining-pays.md); mini fine-tunes better.
    config.model.preset = "tiny"
    config.train.time_budget_minutes = 3.0
    config.train.checkpoint_every_minutes = 1.0
    config.train.keep_checkpoints = 3
    config.train.log_every = 10
    config.train.eval_every = 50
    config.train.eval_batches = 8
    config.train.fill_mask_examples = (
        "and the lord spake unto [MASK], saying,"
        " | the children of [MASK] went up out of the land of egypt."
        " | she could not help [MASK] at the thought of it.")
    return config
