"""Every shipped config loads and turns into valid typed objects (without touching data)."""

import glob
import importlib.util
import os

import pytest

from bertjax import settings
from bertjax.model.config import EncoderConfig
from bertjax.train.optimizer import make_optimizer

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONFIG_FILES = sorted(p for p in glob.glob(os.path.join(REPO, "configs", "*.py"))
                      if not os.path.basename(p).startswith("_"))


def load(path):
    """`path` as --config takes it: FILE or FILE:ARG (ARG passed to get_config)."""
    path, *arg = path.split(":", 1)
    spec = importlib.util.spec_from_file_location(os.path.basename(path)[:-3], path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.get_config(*arg)


# Every platform preset of configs/platform.py, as FILE:NAME.
PLATFORM_FILE = os.path.join(REPO, "configs", "platform.py")
CONFIGS = [p for p in CONFIG_FILES if p != PLATFORM_FILE] + [
    f"{PLATFORM_FILE}:{name}"
    for name in ("cpu", "cpu_bf16", "gpu_8", "tpu_v4_8", "tpu_v5e_8", "tpu_v4_32")]


def test_the_expected_configs_ship():
    names = {os.path.basename(p)[:-3] for p in CONFIG_FILES}
    assert {"base", "tiny", "large", "roberta", "spanbert", "demo"} <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: os.path.basename(p))
def test_config_builds(path):
    config = load(path)
    if config.get("task", "pretrain") != "pretrain":
        s = settings.finetune.read(config, require_data=False)
        s.optimizer_config(max(s.train.steps, 1000))
        return
    s = settings.read(config)
    encoder = s.model.encoder(s.data.vocab_size)
    assert isinstance(encoder, EncoderConfig)
    make_optimizer(s.optimizer)
    schedule = s.schedule
    assert schedule.phase_at(0).seq_len <= encoder.max_position_embeddings
    assert schedule.phase_at(config.train.steps - 1).seq_len <= encoder.max_position_embeddings
    assert s.objective.name == config.objective


def test_base_is_bert_base_and_large_is_bert_large():
    base = settings.read(load(os.path.join(REPO, "configs", "base.py"))).model.encoder(30522)
    large = settings.read(load(os.path.join(REPO, "configs", "large.py"))).model.encoder(30522)
    assert (base.num_layers, base.hidden_size, base.num_heads, base.intermediate_size) == (
        12, 768, 12, 3072)
    assert (large.num_layers, large.hidden_size, large.num_heads, large.intermediate_size) == (
        24, 1024, 16, 4096)
    schedule = settings.read(load(os.path.join(REPO, "configs", "base.py"))).schedule
    assert [(p.seq_len, p.max_predictions, p.start_step) for p in schedule.phases] == [
        (128, 20, 0), (512, 80, 900_000)]


def test_platform_presets_need_a_known_platform_name():
    for spec in (PLATFORM_FILE, f"{PLATFORM_FILE}:tpu"):
        with pytest.raises(KeyError,
                           match="configs/platform.py:NAME with NAME one of cpu, cpu_bf16, gpu_8"):
            load(spec)
