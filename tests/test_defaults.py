"""One place for each default: a config key's default is written once, in the dataclass its section
is read into (or, for a key no dataclass holds, in its base config), and a config file states only
what it changes. Read from the sources (ast), so a second literal fails here before it drifts."""

import ast
import dataclasses
import glob
import importlib
import os

import ml_collections

from bertjax.data.masking_config import MaskingConfig
from bertjax.finetune.readers import Columns, Source
from bertjax.finetune.tasks import TaskSettings
from bertjax.model.config import ENCODER_DEFAULTS, EncoderConfig
from bertjax.settings.defaults import defaults
from bertjax.settings.electra import ElectraSettings
from bertjax.settings.finetune_sections import FinetuneData, FinetuneOptions, TrainSettings
from bertjax.settings.pretrain import CorpusSettings, PretrainLoop, ScheduleSettings
from bertjax.settings.shared import SIZE_KEYS, MeshSettings, ModelSpec
from bertjax.train.optimizer import OptimizerConfig

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
# Each job's schema: its sections and the dataclass each is read into.
SCHEMA = {
    "pretrain": {"model": ModelSpec, "optimizer": OptimizerConfig, "masking": MaskingConfig,
                 "mesh": MeshSettings, "electra": ElectraSettings, "data": CorpusSettings,
                 "schedule": ScheduleSettings, "train": PretrainLoop},
    "finetune": {"model": ModelSpec, "optimizer": OptimizerConfig, "mesh": MeshSettings,
                 "finetune": FinetuneOptions, "data": FinetuneData, "train": TrainSettings},
}
# Lower dataclasses a schema field reads its default from: where it is written and checked.
DELEGATES = (EncoderConfig, TaskSettings, Columns, Source)
BASES = {"pretrain": "base", "finetune": "finetune_base"}


def literal(node):
    """(True, value) for a literal expression (negative numbers too), else (False, None)."""
    try:
        return True, ast.literal_eval(node)
    except (ValueError, TypeError, SyntaxError, MemoryError, RecursionError):
        return False, None


def same(a, b) -> bool:
    return type(a) is type(b) and a == b


def schema_defaults(job: str) -> dict:
    """'section.key' -> default, for every key of the job's schema sections."""
    return {f"{name}.{key}": value for name, cls in SCHEMA[job].items()
            for key, value in defaults(cls).items()}


def leaves(config, prefix="") -> dict:
    values = {}
    for key, value in config.items():
        if isinstance(value, ml_collections.ConfigDict):
            values.update(leaves(value, f"{prefix}{key}."))
        else:
            values[prefix + key] = value
    return values


def settings_in(tree: ast.Module):
    """(line, 'section.key', value) for each literal a config file sets: `x.section.key = V`
    (or `model.key = V` with `model = config.model`; '*.key' for any other `name.key = V`),
    `config.section = section(Cls, key=V)`, and {"section.key": V} entries."""
    aliases = {}
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Attribute) \
                and isinstance(node.targets[0], ast.Name):
            aliases[node.targets[0].id] = node.value.attr  # model = config.model
    for node in ast.walk(tree):
        if isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Attribute):
            target, (is_literal, value) = node.targets[0], literal(node.value)
            if isinstance(node.value, ast.Call):  # config.model = section(ModelSpec, ...)
                for keyword in node.value.keywords:
                    is_literal, value = literal(keyword.value)
                    if keyword.arg and is_literal:
                        yield node.lineno, f"{target.attr}.{keyword.arg}", value
            elif not is_literal:
                continue
            elif isinstance(target.value, ast.Attribute):
                yield node.lineno, f"{target.value.attr}.{target.attr}", value
            elif isinstance(target.value, ast.Name):  # section.key = V in a builder: any section
                yield node.lineno, f"{aliases.get(target.value.id, '*')}.{target.attr}", value
        elif isinstance(node, ast.Dict):
            for k, v in zip(node.keys, node.values):
                is_literal, value = literal(v)
                if isinstance(k, ast.Constant) and "." in str(k.value) and is_literal:
                    yield node.lineno, k.value, value


def parent_of(tree: ast.Module) -> str | None:
    """The config a config file starts from: the module whose get_config() it calls."""
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                and node.func.attr == "get_config" and isinstance(node.func.value, ast.Name):
            return node.func.value.id
    return None


def restated_in_configs(configs_dir: str, job_of) -> list[str]:
    """Each literal a config file sets to the value the key already holds there: its parent
    config's, or for a file built on none, the schema default. `job_of(path)`: its job."""
    found = []
    for path in sorted(glob.glob(os.path.join(configs_dir, "*.py"))):
        tree = ast.parse(open(path).read())
        parent, job = parent_of(tree), job_of(path)
        before = (leaves(importlib.import_module(f"configs.{parent}").get_config())
                  if parent else schema_defaults(job))
        for line, key, value in settings_in(tree):
            keys = [k for k in before if k.endswith(key[1:])] if key[0] == "*" else [key]
            if any(k in before and same(before[k], value) for k in keys):
                found.append(f"{os.path.basename(path)}:{line} {key} = {value!r} "
                             f"(already {'configs/' + parent + '.py' if parent else 'the default'})")
    return found


def job_of(path: str) -> str:
    name = os.path.basename(path)[:-3]
    return "finetune" if name.startswith(("finetune", "distill")) else "pretrain"


def literal_fields(tree: ast.Module):
    """(class name, line, field, value) for each literal field default of a dataclass."""
    for cls in ast.walk(tree):
        if isinstance(cls, ast.ClassDef) and any("dataclass" in ast.unparse(d)
                                                 for d in cls.decorator_list):
            for node in cls.body:
                if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name) \
                        and node.value is not None:
                    is_literal, value = literal(node.value)
                    if is_literal:
                        yield cls.name, node.lineno, node.target.id, value


def literal_tables(tree: ast.Module):
    """(line, keys and values) of each module-level dict of literals (dict(...) or {...})."""
    for node in tree.body:
        value = getattr(node, "value", None)
        if isinstance(value, ast.Call) and getattr(value.func, "id", "") == "dict":
            pairs = [(k.arg, literal(k.value)) for k in value.keywords]
        elif isinstance(value, ast.Dict):
            pairs = [(getattr(k, "value", None), literal(v)) for k, v in zip(value.keys,
                                                                             value.values)]
        else:
            continue
        yield node.lineno, {k: v for k, (ok, v) in pairs if ok and isinstance(k, str)}


def second_defaults_in_sources(source_dir: str) -> list[str]:
    """Each literal in the sources that restates a schema key's default under its name: a
    dataclass field outside the schema and its delegates, a schema field that writes out its
    delegate's default instead of reading it, or a module-level table of such values."""
    keys = {}  # key name -> its defaults (the same name in several sections or jobs)
    for job in SCHEMA:
        for key, value in schema_defaults(job).items():
            keys.setdefault(key.split(".")[1], []).append(value)
    owners = {cls.__name__ for job in SCHEMA.values() for cls in job.values()}
    delegated = {(cls.__name__, f.name): f.default for cls in DELEGATES
                 for f in dataclasses.fields(cls) if f.default is not dataclasses.MISSING}
    delegates = {cls.__name__ for cls in DELEGATES}
    found = []
    for path in sorted(glob.glob(os.path.join(source_dir, "**", "*.py"), recursive=True)):
        tree, where = ast.parse(open(path).read()), os.path.relpath(path, source_dir)
        for cls, line, name, value in literal_fields(tree):
            if cls in owners:
                again = [c for (c, n), v in delegated.items() if n == name and same(v, value)]
                if again and not (cls == "ModelSpec" and name in (*SIZE_KEYS, "scan_layers")):
                    found.append(f"{where}:{line} {cls}.{name} = {value!r} restates "
                                 f"{again[0]}'s default: read it from there")
            elif cls not in delegates and any(same(v, value) for v in keys.get(name, ())):
                found.append(f"{where}:{line} {cls}.{name} = {value!r} is a schema default")
        for line, table in literal_tables(tree):
            again = [k for k, v in table.items() if any(same(v, d) for d in keys.get(k, ()))]
            if len(again) > 1:
                found.append(f"{where}:{line} a table of schema defaults ({', '.join(again)})")
    return found


def test_no_config_file_restates_a_value_it_already_has():
    assert restated_in_configs(os.path.join(REPO, "configs"), job_of) == []


def test_no_second_literal_default_in_the_sources():
    assert second_defaults_in_sources(os.path.join(REPO, "bertjax")) == []


def test_the_base_configs_are_built_from_the_schema():
    for job, base in BASES.items():
        config = leaves(importlib.import_module(f"configs.{base}").get_config())
        expected = schema_defaults(job)
        skipped = {"optimizer.total_steps", "data.vocab_size_given"} | (
            {"optimizer.warmup_steps"} if job == "finetune" else set())
        assert set(expected) - skipped <= set(config), job
        for section, cls in SCHEMA[job].items():
            declared = {k.split(".")[1] for k in config if k.startswith(section + ".")}
            fields = {f.name for f in dataclasses.fields(cls)}
            assert declared - fields <= {"warmup_fraction"}, (job, section)


def test_the_model_section_reads_the_encoders_defaults():
    spec = defaults(ModelSpec)
    for name, value in spec.items():
        if name in ENCODER_DEFAULTS and name not in (*SIZE_KEYS, "scan_layers"):
            assert same(value, ENCODER_DEFAULTS[name]), name


def test_the_checks_find_a_second_default(tmp_path):
    """The scanners see a restated default in a dataclass, a schema field, a table, a config."""
    (tmp_path / "spans.py").write_text(
        "import dataclasses\n@dataclasses.dataclass\nclass Spans:\n"
        "    mask_prob: float = 0.15\n    max_span_length: int = 11\n"
        "@dataclasses.dataclass\nclass ModelSpec:\n    dtype: str = 'float32'\n"
        "TABLE = dict(norm='post', mlp='gelu')\n")
    assert second_defaults_in_sources(str(tmp_path)) == [
        "spans.py:4 Spans.mask_prob = 0.15 is a schema default",
        "spans.py:8 ModelSpec.dtype = 'float32' restates EncoderConfig's default: read it from "
        "there", "spans.py:9 a table of schema defaults (norm, mlp)"]
    configs = tmp_path / "configs"
    configs.mkdir()
    (configs / "short.py").write_text(
        "from configs import base\ndef get_config():\n    config = base.get_config()\n"
        "    config.masking.mask_prob = 0.15\n    config.train.steps = 10\n    return config\n")
    (configs / "own.py").write_text(
        "def get_config():\n    config.model = section(ModelSpec, dtype='float32')\n")
    assert restated_in_configs(str(configs), lambda path: "pretrain") == [
        "own.py:2 model.dtype = 'float32' (already the default)",
        "short.py:4 masking.mask_prob = 0.15 (already configs/base.py)"]
