"""The real fine-tuning datasets that ship inside registry packages (`packaged:NAME:SPLIT`):
`datasets` names them and reads their examples; `wiki_pairs` builds the Wikipedia retrieval
pairs one of them is (also a command: `python -m bertjax.retrieval.wiki_pairs`)."""
