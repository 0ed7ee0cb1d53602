"""Regression (STS-B style): the human sentiment score (-4 .. 4) of the movie-review sentences,
Pearson and Spearman correlation.

    python -m bertjax.main --config=configs/finetune_regression.py --workdir=DIR \
        --config.init_checkpoint=PRETRAINED

For GLUE STS-B: --config.data.train=train.tsv --config.data.eval=dev.tsv
--config.data.text_column=sentence1 --config.data.text_pair_column=sentence2
--config.data.label_column=score.
"""

from configs import finetune_base


def get_config():
    config = finetune_base.get_config()
    config.task = "finetune_regression"
    config.data.train = "packaged:movie_review_scores:train"
    config.data.eval = "packaged:movie_review_scores:dev"
    config.data.max_seq_len = 64
    return config
