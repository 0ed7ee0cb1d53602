"""Span classification: the type of a marked span of a text, read from the span representation
[h_start; h_end; pooled span] (mean or attention pooling). The defaults: the entities of the
packaged tweets (packaged:tweet_entities, from the BIO-tagged tweet_ner data: each entity's
characters in the tweet, labelled with its type), accuracy / macro F1 / MCC.

    python -m bertjax.main --config=configs/finetune_span_classification.py --workdir=DIR \
        --config.init_checkpoint=PRETRAINED [--config.finetune.span_pooling=attention]

Your own data (TSV, CSV or JSONL; start and end are character offsets, end exclusive):
    --config.data.train=train.jsonl --config.data.eval=dev.jsonl
    --config.data.text_column=text --config.data.span_start_column=start
    --config.data.span_end_column=end --config.data.label_column=label
A span beyond max_seq_len tokens is skipped and counted; one outside its text, or with
start >= end, is refused (file and line named).
"""

from configs import finetune_base


def get_config():
    config = finetune_base.get_config()
    config.task = "finetune_span_classification"
    # finetune.span_pooling: mean (the default) | attention (a learned score per token)
    config.data.train = "packaged:tweet_entities:train"
    config.data.eval = "packaged:tweet_entities:dev"
    # The format from the file's extension, and the columns text, start, end and label (start,
    # end and label are the defaults).
    config.data.text_column = "text"
    config.data.max_seq_len = 64
    config.train.epochs = 4
    config.train.main_metric = "accuracy"
    return config
