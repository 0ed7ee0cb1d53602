"""Multilingual BERT (mBERT): BERT-base's recipe over several languages with one shared WordPiece
vocabulary, languages sampled with p_l proportional to (token share)^0.7.

    python -m bertjax.main --config=configs/mbert.py --workdir=DIR \
        --config.data.languages='en=corpus/en/*.txt,es=corpus/es/*.txt'
"""

from configs import base


def get_config():
    config = base.get_config()
    config.data.lowercase = False  # mBERT's cased vocabulary keeps accents and case
    config.data.vocab_size = 119_547  # mBERT's (cased)
    return config
