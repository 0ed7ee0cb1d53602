"""BERT-large (L=24, H=1024, A=16, 340M parameters) with the BERT-base recipe."""

from configs import base


def get_config():
    config = base.get_config()
    config.model.preset = "large"
    return config
