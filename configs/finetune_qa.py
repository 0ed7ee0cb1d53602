"""Extractive question answering on SQuAD v1.1 JSON: `[CLS] question [SEP] context [SEP]`, start
and end scores over context tokens, windows every 128 tokens, answers of at most 30 tokens, the
official exact match / F1.

    python -m bertjax.main --config=configs/finetune_qa.py --workdir=DIR \
        --config.init_checkpoint=PRETRAINED \
        --config.data.train=train-v1.1.json --config.data.eval=dev-v1.1.json
"""

from configs import finetune_base


def get_config():
    config = finetune_base.get_config()
    config.task = "finetune_qa"
    config.data.format = "squad"
    config.data.max_seq_len = 384
    # The defaults (finetune_base.py): data.doc_stride 128, data.max_query_length 64,
    # data.max_answer_length 30, and finetune.qa_scorer start_end, BERT's start + end logits;
    # finetune.qa_scorer=span is an MLP over [h_start; h_end; pooled span] of every candidate
    # span (pooled by finetune.span_pooling: mean | attention).
    config.optimizer.learning_rate = 5e-5
    config.train.epochs = 2
    return config
