"""Dual-encoder retrieval with in-batch negatives: each query of a batch against every document of
the batch (its positives, plus the hard negatives when data.negative_column is set), softmax over
cosine / temperature. Queries and documents are the mean (or [CLS]) of the last layer,
L2-normalized. Each epoch ends with exact search of every dev query among all dev documents:
MRR@10 (picks the best checkpoint), Recall@1, Recall@10, nDCG@10.

The defaults train on real Wikipedia: query = a sentence taken out of a paragraph, document = the
rest of that paragraph, split by article (packaged:wiki_retrieval, `bertjax.finetune.packaged.wiki_pairs`,
which also writes these rows as files):

    python -m bertjax.main --config=configs/finetune_retrieval.py --workdir=DIR \
        --config.init_checkpoint=PRETRAINED

Then `bertjax.load(DIR).embed(texts, pooling="mean", normalize=True)` embeds with the trained
(query) encoder. Your own rows, TSV/CSV with a header or JSONL:
    --config.data.train=train.jsonl --config.data.eval=dev.jsonl
    --config.data.text_column=query --config.data.text_pair_column=positive
    [--config.data.negative_column=negative]   hard negatives (2x the document work)
    [--config.finetune.separate_encoders=true] a document encoder of its own: the run keeps
        {"encoder": query encoder, "document_encoder"}; bertjax.load embeds with the query one,
        run.json heads.encoders says which subtree is which
    [--config.finetune.pooling=cls] [--config.finetune.temperature=0.05]
"""

from configs import finetune_base


def get_config():
    config = finetune_base.get_config()
    config.task = "finetune_retrieval"
    config.data.train = "packaged:wiki_retrieval:train"
    config.data.eval = "packaged:wiki_retrieval:dev"
    config.data.format = "jsonl"
    config.data.text_column = "query"
    config.data.text_pair_column = "positive"
    # Documents: data.max_seq_len, the default 128 (the median paragraph rest is ~120 tokens).
    config.data.max_query_length = 48       # queries (one sentence), [CLS] and [SEP] included
    # finetune.pooling (mean), finetune.separate_encoders (false), finetune.temperature (0.05)
    # and data.negative_column (none) keep their defaults.
    # More in-batch negatives per query help; 2e-5 as in DPR (Karpukhin et al., 2020).
    config.train.batch_size = 64
    config.optimizer.learning_rate = 2e-5
    return config
