"""Interoperation with other frameworks' weight layouts (Hugging Face BERT)."""
