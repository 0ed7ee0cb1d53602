"""Sentence-pair classification (paraphrase, NLI): `[CLS] A [SEP] B [SEP]` with segment ids,
accuracy and F1 (of the second label, "1" = paraphrase in MRPC). The defaults read GLUE's MRPC
TSVs; point data.train / data.eval at them:

    python -m bertjax.main --config=configs/finetune_pair.py --workdir=DIR \
        --config.init_checkpoint=PRETRAINED \
        --config.data.train=MRPC/train.tsv --config.data.eval=MRPC/dev.tsv

MNLI: --config.data.text_column=sentence1 --config.data.text_pair_column=sentence2
--config.data.label_column=gold_label (dev_matched.tsv); or tfds:glue/mrpc:train.
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
