"""XLM-R (Conneau et al., 2020): RoBERTa's recipe (MLM only, full sentences, dynamic masks) over
several languages with one SentencePiece unigram vocabulary, languages sampled with p_l
proportional to (token share)^0.3, positions counted from the padding id as fairseq does.

    python -m bertjax.main --config=configs/xlmr.py --workdir=DIR \
        --config.data.languages='en=corpus/en/*.txt,es=corpus/es/*.txt'
"""

from configs import roberta


def get_config():
    config = roberta.get_config()
    config.data.tokenizer_type = "sentencepiece"
    config.data.lowercase = False
    config.data.language_alpha = 0.3
    config.data.vocab_size = 250_002  # XLM-R's
    config.model.positions_from_padding = True
    config.model.max_position_embeddings = 514  # 512 tokens after the pad id and its offset
    return config
