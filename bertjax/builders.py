"""Config in, typed objects out: the one place that reads a pretraining ConfigDict.

Everything below this layer takes dataclasses and plain values, so the library can be used without
ml_collections, and a bad config is refused here, by key name, before any work starts.
"""

from __future__ import annotations

import dataclasses
import os

import ml_collections

from bertjax.errors import UserError
from bertjax.model.config import EncoderConfig, preset

OBJECTIVES = {
    # name: (next-sentence prediction, span boundary objective, example mode)
    "bert": (True, False, "nsp"),
    "roberta": (False, False, "full_sentences"),
    "spanbert": (False, True, "full_sentences"),
}

# model.preset value that takes the shape and vocabulary from config.init_checkpoint.
FROM_CHECKPOINT = "from_checkpoint"
_SIZE_KEYS = ("num_layers", "hidden_size", "num_heads", "intermediate_size")


@dataclasses.dataclass(frozen=True)
class Objective:
    name: str
    nsp: bool
    sbo: bool
    mode: str


def objective(config: ml_collections.ConfigDict) -> Objective:
    name = config.objective
    if name not in OBJECTIVES:
        raise UserError(f"unknown objective {name!r}; choose one of {', '.join(OBJECTIVES)}")
    nsp, sbo, mode = OBJECTIVES[name]
    if sbo and config.masking.strategy != "span":
        raise UserError("objective spanbert needs masking.strategy='span' (the span boundary "
                        f"objective predicts masked spans), got {config.masking.strategy!r}")
    return Objective(name, nsp, sbo, mode)


def validate_train(config: ml_collections.ConfigDict) -> None:
    train = config.train
    for key in ("steps", "batch_size", "accumulation_steps"):
        if int(train[key]) <= 0:
            raise UserError(f"train.{key} must be positive, got {train[key]}")
    for key in ("log_every", "checkpoint_every", "eval_every", "eval_batches", "keep_checkpoints"):
        if int(train[key]) < 0:
            raise UserError(f"train.{key} must not be negative, got {train[key]}")
    if train.get("device_memory_gb", 0) < 0:
        raise UserError(f"train.device_memory_gb must not be negative, got "
                        f"{train.device_memory_gb}")
    if train.batch_size % train.accumulation_steps:
        raise UserError(f"train.batch_size {train.batch_size} is not divisible by "
                        f"train.accumulation_steps {train.accumulation_steps}")


def encoder_config(config: ml_collections.ConfigDict, vocab_size: int | None = None,
                   pad_token_id: int = 0) -> EncoderConfig:
    """The encoder a config describes; `vocab_size` is the tokenizer's once it is known (until
    then: data.vocab_size, or the init checkpoint's with model.preset=from_checkpoint)."""
    m = config.model
    if m.preset == FROM_CHECKPOINT:
        return _encoder_from_checkpoint(config, vocab_size)
    overrides = dict(
        vocab_size=config.data.vocab_size if vocab_size is None else vocab_size,
        pad_token_id=pad_token_id, dtype=m.dtype,
        param_dtype=m.param_dtype, hidden_dropout=m.hidden_dropout,
        attention_dropout=m.attention_dropout, scan_layers=m.scan_layers, remat=m.remat,
        max_position_embeddings=m.max_position_embeddings, type_vocab_size=m.type_vocab_size)
    # Explicit sizes in the config win over the preset's (e.g. --config.model.num_layers=3).
    for key in _SIZE_KEYS:
        if key in m and m[key]:
            overrides[key] = m[key]
    return preset(m.preset, **overrides)


def _encoder_from_checkpoint(config: ml_collections.ConfigDict,
                             vocab_size: int | None) -> EncoderConfig:
    """The init checkpoint's recorded shape and vocabulary with this config's numerics (dtypes,
    dropout, scan, remat): continuing from a converted Hugging Face model needs no sizes."""
    from bertjax.interop import params_dir

    if not config.init_checkpoint:
        raise UserError(f"model.preset={FROM_CHECKPOINT} takes the model shape from "
                        "config.init_checkpoint, which is not set")
    recorded, _ = params_dir.recorded_model(config.init_checkpoint)
    m = config.model
    for key in _SIZE_KEYS:
        if key in m and m[key] and m[key] != getattr(recorded, key):
            raise UserError(f"model.{key}={m[key]} disagrees with the init checkpoint's "
                            f"{getattr(recorded, key)}; leave it 0 with {FROM_CHECKPOINT}")
    if vocab_size is not None and vocab_size > recorded.vocab_size:
        raise UserError(f"the tokenizer has {vocab_size} tokens, the init checkpoint embeds "
                        f"{recorded.vocab_size}: prepare the corpus with the checkpoint's "
                        "vocabulary")
    return recorded.replace(
        dtype=m.dtype, param_dtype=m.param_dtype, hidden_dropout=m.hidden_dropout,
        attention_dropout=m.attention_dropout, scan_layers=m.scan_layers, remat=m.remat)


def checkpoint_tokenizer(config: ml_collections.ConfigDict):
    """The init checkpoint's own tokenizer when model.preset=from_checkpoint, else None."""
    if config.model.preset != FROM_CHECKPOINT:
        return None
    from bertjax.data.tokenizer import load_tokenizer
    from bertjax.interop import params_dir

    _, directory = params_dir.recorded_model(config.init_checkpoint)
    if directory is None and not config.data.tokenizer:
        raise UserError(f"the init checkpoint {config.init_checkpoint} keeps no tokenizer; set "
                        "--config.data.tokenizer to its vocabulary")
    return load_tokenizer(directory) if directory else None


def masking_config(config: ml_collections.ConfigDict):
    from bertjax.data.masking import MaskingConfig

    return MaskingConfig(**_fields_of(MaskingConfig, config.masking, "masking"))


def length_schedule(config: ml_collections.ConfigDict):
    from bertjax.data.pretraining import LengthSchedule

    s = config.schedule
    if not 0.0 <= s.long_fraction <= 1.0:
        raise UserError(f"schedule.long_fraction must be in [0, 1], got {s.long_fraction}")
    return LengthSchedule.bert(
        config.train.steps, long_fraction=s.long_fraction,
        short=(s.short_seq_len, s.short_max_predictions),
        long=(s.long_seq_len, s.long_max_predictions))


def optimizer_config(config: ml_collections.ConfigDict):
    from bertjax.train.optimizer import OptimizerConfig

    fields = _fields_of(OptimizerConfig, config.optimizer, "optimizer", skip=("total_steps",))
    return OptimizerConfig(total_steps=config.train.steps, **fields)


def mesh(config: ml_collections.ConfigDict):
    from bertjax.parallel.mesh import make_mesh

    return make_mesh(data=config.mesh.data, fsdp=config.mesh.fsdp, tensor=config.mesh.tensor)


def data_inputs(config: ml_collections.ConfigDict) -> tuple[list[str], str]:
    """The raw corpus inputs and their format; the demo corpus is fetched on first use."""
    from bertjax.data.sources import DEMO_INPUT

    raw = config.data.input.strip()
    if not raw:
        raise UserError("no corpus: set --config.data.input to text files, a directory, a glob "
                        f"or tfds:NAME (or {DEMO_INPUT} for the demo corpus)")
    if raw == DEMO_INPUT:
        return [DEMO_INPUT], "sentences"  # the demo corpus is written in the sentences layout
    return [part.strip() for part in raw.split(",") if part.strip()], config.data.input_format


def prepared_dir(config: ml_collections.ConfigDict, workdir: str) -> str:
    return config.data.prepared or os.path.join(workdir, "data")


def prepared_corpus(config: ml_collections.ConfigDict, workdir: str, *, may_prepare: bool = True):
    """Opens the prepared corpus, preparing it first (and training a vocabulary) when needed.

    `may_prepare=False` (processes other than 0 of a multi-process run, which prepares it once
    for all) refuses a missing corpus instead.
    """
    from bertjax.data import corpus, prepare
    from bertjax.data.tokenizer import load_tokenizer

    directory = prepared_dir(config, workdir)
    required = checkpoint_tokenizer(config)
    if not os.path.exists(os.path.join(directory, corpus.MANIFEST)):
        if not may_prepare:
            raise UserError(f"the prepared corpus {directory} is missing on this host although "
                            "process 0 has it: with several hosts, the workdir (or "
                            "data.prepared) must be on a file system every host shares")
        inputs, input_format = data_inputs(config)
        d = config.data
        if d.tokenizer:
            tokenizer = load_tokenizer(d.tokenizer, lowercase=d.lowercase)
        elif required is not None:
            tokenizer = required
        else:
            tokenizer = prepare.build_tokenizer(inputs, input_format, kind=d.tokenizer_type,
                                                vocab_size=d.vocab_size, lowercase=d.lowercase)
        prepare.prepare(inputs, input_format, directory, tokenizer, workers=max(1, os.cpu_count() or 1))
    prepared = corpus.PreparedCorpus.open(directory)
    if required is not None and not _same_vocabulary(prepared.tokenizer, required):
        raise UserError(f"the corpus in {directory} was tokenized with another vocabulary than "
                        "the init checkpoint's; prepare it with that one (a new data.prepared)")
    return prepared


def _same_vocabulary(a, b) -> bool:
    return (a.kind, a.lowercase, a.vocab_size) == (b.kind, b.lowercase, b.vocab_size) and all(
        a.id_to_token(i) == b.id_to_token(i) for i in range(a.vocab_size))


def build_pretraining_data(config: ml_collections.ConfigDict, workdir: str, *,
                           process_index: int = 0, process_count: int = 1,
                           may_prepare: bool = True):
    """(PretrainingData, Tokenizer) for a pretraining config; prepares the corpus if needed.

    The batches are split into `process_count` row blocks, of which this process builds block
    `process_index` (see `partitioning.process_batch_slice`).
    """
    from bertjax.data.masking import Masker  # noqa: F401  (imported for its validation errors)
    from bertjax.data.pretraining import PretrainingData

    validate_train(config)
    obj = objective(config)
    corpus = prepared_corpus(config, workdir, may_prepare=may_prepare)
    data = PretrainingData(
        corpus, mode=obj.mode, masking=masking_config(config), schedule=length_schedule(config),
        global_batch_size=config.train.batch_size, seed=config.train.seed,
        process_index=process_index, process_count=process_count,
        short_seq_prob=config.data.short_seq_prob, eval_fraction=config.data.eval_fraction,
        workers=config.data.workers, prefetch=config.data.prefetch)
    return data, corpus.tokenizer


def _fields_of(cls, section: ml_collections.ConfigDict, prefix: str, skip=()) -> dict:
    names = {f.name for f in dataclasses.fields(cls)} - set(skip)
    unknown = sorted(set(section.keys()) - names)
    if unknown:
        raise UserError(f"unknown setting(s) {', '.join(prefix + '.' + k for k in unknown)}")
    return {k: section[k] for k in section.keys()}
