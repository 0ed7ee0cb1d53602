"""XLM (Lample & Conneau, 2019): masked language modelling over several languages mixed with
translation language modelling on parallel text (translation pairs in one row, both sides
masked, positions restarting at the second sentence, a language embedding per token), one
SentencePiece vocabulary, languages sampled with p_l proportional to (token share)^0.5.

    python -m bertjax.data.parallel_text --output pairs/kjv-rv1909.tsv   # English-Spanish verses
    python -m bertjax.main --config=configs/xlm_tlm.py --workdir=DIR \\
        --config.data.languages='en=corpus/en/*.txt,es=corpus/es/*.txt' \\
        --config.data.parallel=en-es=pairs/kjv-rv1909.tsv
"""

from configs import base


def get_config():
    config = base.get_config()
    config.objective = "roberta"  # MLM only: XLM has no next-sentence prediction
    config.data.separate_documents = True  # rows carry positions (TLM restarts them)
    config.data.tokenizer_type = "sentencepiece"
    config.data.lowercase = False
    config.data.language_alpha = 0.5
    config.data.tlm_fraction = 0.5
    config.data.vocab_size = 95_000  # XLM-100's
    config.model.type_vocab_size = 16  # the language embedding: one row per language
    config.schedule.long_fraction = 1.0
    return config
