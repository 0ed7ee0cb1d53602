"""Sentence-pair classification (paraphrase, NLI): `[CLS] A [SEP] B [SEP]` with segment ids,
accuracy and F1 (of data.positive_label, by default the second label: "1" = paraphrase in MRPC).
The defaults read GLUE's MRPC TSVs; point data.train / data.eval at them:

    python -m bertjax.main --config=configs/finetune_pair.py --workdir=DIR \
        --config.init_checkpoint=PRETRAINED \
        --config.data.train=MRPC/train.tsv --config.data.eval=MRPC/dev.tsv

MRPC from TFDS (the dataset's label order not_equivalent, equivalent is kept: F1 of equivalent):
    --config.data.train=tfds:glue/mrpc:train --config.data.eval=tfds:glue/mrpc:validation
    --config.data.text_column=sentence1 --config.data.text_pair_column=sentence2
    --config.data.label_column=label --config.data.labels=

MNLI (GLUE TSVs; three labels, so accuracy picks the best checkpoint, as GLUE reports it):
    --config.data.train=MNLI/train.tsv --config.data.eval=MNLI/dev_matched.tsv
    --config.data.text_column=sentence1 --config.data.text_pair_column=sentence2
    --config.data.label_column=gold_label --config.data.labels=contradiction,entailment,neutral
    --config.train.main_metric=accuracy
"""

from configs import finetune_base


def get_config():
    config = finetune_base.get_config()
    config.task = "finetune_classification"
    config.data.format = "tsv"
    config.data.text_column = "#1 String"
    config.data.text_pair_column = "#2 String"
    config.data.label_column = "Quality"
    config.data.labels = "0,1"
    config.train.main_metric = "f1"
    return config
