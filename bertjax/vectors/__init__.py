"""Vectors after the encoder: standardisation statistics and the geometry of embedding spaces
(numpy only, below every user of embeddings)."""
