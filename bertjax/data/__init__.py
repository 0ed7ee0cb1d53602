"""Pretraining data: raw text sources, vocabularies, the prepared (tokenized, sharded) corpus,
and the masked fixed-shape batches built from it. Imports only bertjax.core."""
