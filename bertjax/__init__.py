"""bertjax: pretraining and fine-tuning BERT-style encoders with JAX and Flax."""

__version__ = "0.1.0"
