"""Every shipped config loads and turns into valid typed objects (without touching data)."""

import glob
import importlib.util
import os

import pytest

from bertjax import builders
from bertjax.model.config import EncoderConfig
from bertjax.train.optimizer import make_optimizer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_FILES = sorted(p for p in glob.glob(os.path.join(REPO, "configs", "*.py"))
                      if not os.path.basename(p).startswith("_"))


def load(path):
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config()


def test_the_expected_configs_ship():
    names = {os.path.basename(p)[:-3] for p in CONFIG_FILES}
    assert {"base", "tiny", "large", "roberta", "spanbert", "demo"} <= names


@pytest.mark.parametrize("path", CONFIG_FILES, ids=lambda p: os.path.basename(p))
def test_config_builds(path):
    config = load(path)
    if config.get("task", "pretrain") != "pretrain":
        from bertjax.finetune import trainer

        trainer.validate(config)
        return
    builders.validate_train(config)
    objective = builders.objective(config)
    encoder = builders.encoder_config(config, config.data.vocab_size)
    assert isinstance(encoder, EncoderConfig)
    make_optimizer(builders.optimizer_config(config))
    schedule = builders.length_schedule(config)
    builders.masking_config(config)
    assert schedule.phase_at(0).seq_len <= encoder.max_position_embeddings
    assert schedule.phase_at(config.train.steps - 1).seq_len <= encoder.max_position_embeddings
    assert objective.name == config.objective


def test_base_is_bert_base_and_large_is_bert_large():
    base = builders.encoder_config(load(os.path.join(REPO, "configs", "base.py")), 30522)
    large = builders.encoder_config(load(os.path.join(REPO, "configs", "large.py")), 30522)
    assert (base.num_layers, base.hidden_size, base.num_heads, base.intermediate_size) == (
        12, 768, 12, 3072)
    assert (large.num_layers, large.hidden_size, large.num_heads, large.intermediate_size) == (
        24, 1024, 16, 4096)
    schedule = builders.length_schedule(load(os.path.join(REPO, "configs", "base.py")))
    assert [(p.seq_len, p.max_predictions, p.start_step) for p in schedule.phases] == [
        (128, 20, 0), (512, 80, 900_000)]
