"""Every shipped config loads and turns into valid typed objects (without touching data); the
config files declare every key the settings read, and the settings read no key the config lacks."""

import glob
import importlib.util
import os
import sys

import ml_collections
import pytest

from bertjax import settings
from bertjax.cli.main import parse_config
from bertjax.core.errors import UserError
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


def leaf_keys(config: ml_collections.ConfigDict, prefix: str = "") -> list[str]:
    keys = []
    for key in config.keys():
        if isinstance(config[key], ml_collections.ConfigDict):
            keys += leaf_keys(config[key], f"{prefix}{key}.")
        else:
            keys.append(prefix + key)
    return keys


def read_any(name: str, config):
    if name in ("base", "electra"):
        return settings.read(config)
    # The config alone is checked (data paths and the teacher are files).
    return settings.finetune.read(config, require_data=False)


def config_file(name):
    return os.path.join(REPO, "configs", f"{name}.py")


def declared(name: str, section: str | None = None, but: str | None = None):
    """(name, key) of each key of configs/NAME.py, in `section` only or all `but` one."""
    return [(name, key) for key in leaf_keys(load(config_file(name)))
            if key.split(".")[0] != but and section in (None, key.split(".")[0])]


# Each base declares every key of its job. The electra section is read with objective electra
# only, the distill section where it exists (its presence makes a run a student).
DECLARED = (declared("base", but="electra") + declared("electra", section="electra")
            + declared("finetune_base") + declared("distill", section="distill"))


def test_every_key_of_a_base_is_declared_and_sections_are_shared():
    base, finetune = load(config_file("base")), load(config_file("finetune_base"))
    for section in ("model", "optimizer", "mesh"):
        assert set(leaf_keys(base[section])) - {"warmup_steps"} == \
            set(leaf_keys(finetune[section])) - {"warmup_fraction"}, section
    for key in ("finetune.qa_scorer", "finetune.span_pooling", "data.span_start_column",
                "data.span_end_column", "data.negative_column", "train.bucket_multiple",
                "data.max_train_examples_per_class", "model.matmul_dtype"):
        assert key in leaf_keys(finetune), key
    assert [key for key in leaf_keys(base) if key.startswith("electra.")]
    assert load(config_file("distill")).distill.student_layers == 2
    assert load(config_file("finetune_base")).train.bucket_multiple == 32


@pytest.mark.parametrize("name,key", DECLARED, ids=[f"{n}:{k}" for n, k in DECLARED])
def test_a_missing_key_is_refused_by_name(name, key):
    config = load(config_file(name))
    read_any(name, config)  # the whole config reads
    *sections, leaf = key.split(".")
    section = config
    for part in sections:
        section = section[part]
    del section[leaf]
    with pytest.raises(UserError) as refused:
        read_any(name, config)
    message = str(refused.value)
    assert f"the config has no {key}:" in message and "\n" not in message


def test_an_unknown_key_in_a_config_file_is_refused_by_name():
    config = load(config_file("tiny"))
    config.train.epochs = 3
    with pytest.raises(UserError, match=r"unknown setting\(s\) train.epochs"):
        settings.read(config)
    config = load(config_file("finetune_base"))
    config.optimizer.warmup_steps = 3  # fine-tuning warms up by warmup_fraction
    with pytest.raises(UserError, match=r"unknown setting\(s\) optimizer.warmup_steps"):
        settings.finetune.read(config, require_data=False)


@pytest.mark.parametrize("name,override", [("tiny", "train.bogus"),
                                           ("finetune_sentiment", "data.text_colum"),
                                           ("distill", "distill.teachr")])
def test_an_unknown_key_in_an_override_is_refused(monkeypatch, name, override):
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    with pytest.raises(UserError, match="unknown config key"):
        parse_config(["main", f"--config={config_file(name)}", f"--config.{override}=1"])


def test_a_config_loads_by_absolute_path_from_another_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr(sys, "argv", list(sys.argv))
    config, _ = parse_config(["main", f"--config={config_file('finetune_sentiment')}",
                              "--config.train.bucket_multiple=0"])
    s = settings.read(config)
    assert s.train.bucket_multiple == 0 and s.optimizer["eps"] == 1e-8
