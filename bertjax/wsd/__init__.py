"""Word sense disambiguation by 1-nearest neighbour over contextual word embeddings.

    python -m bertjax.wsd evaluate --model PATH [--lemmas 50] [--layers -1 | -4,-3,-2,-1]
    python -m bertjax.wsd fit --model PATH --output DIR [--lemmas N] [--layers ...]
    python -m bertjax.wsd predict --index DIR --sentence "he sat on the bank" --word bank
    (each takes --standardize WORDS.npz: word-vector statistics applied before comparing)

A sense's embedding is the mean contextual embedding (`Model.word_vectors`) of its lemma over the
sense's labelled examples; an occurrence gets the candidate sense whose embedding is nearest by
cosine. The candidates for a word are the senses of the lemmas it can be a form of under WordNet's
morphology, part of speech by part of speech ("banked" can only be the verb). The data are WordNet
3.0's example sentences (`bertjax.wsd.wordnet`); `evaluate` holds out examples of each sense and
compares with the most-frequent-sense baseline: among the same candidates, the sense with the most
training examples, ties going to WordNet's lower sense number. An index (DIR/wsd_index.json +
DIR/sense_vectors.npz) records a digest of the encoder's parameters and refuses any other model,
and the digest of the standardisation statistics it was fitted with (needed again to predict).
`evaluate` also splits its accuracy by how frequent the lemmas are in the Wikipedia demo corpus.
"""

from bertjax.wsd.evaluation import Evaluation, corpus_frequencies, evaluate
from bertjax.wsd.index import SenseIndex, model_digest, read_info

__all__ = ["Evaluation", "SenseIndex", "corpus_frequencies", "evaluate", "model_digest",
           "read_info"]
