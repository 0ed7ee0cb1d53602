"""Pretraining settings: the objective, corpus, masking, length schedule, optimizer and loop, all
checked here, before any file is read or written."""

from __future__ import annotations

import dataclasses
import os

from bertjax.data.examples import MIN_SEQ_LEN
from bertjax.data.inputs import NAMED_INPUTS
from bertjax.data.sources import FORMATS as INPUT_FORMATS
from bertjax.data.masking_config import MaskingConfig
from bertjax.data.length_schedule import LengthSchedule
from bertjax.data import read_ahead
from bertjax.data.tokenizer_training import TOKENIZER_KINDS
from bertjax.core import storage_urls
from bertjax.core.errors import UserError, check_choice, check_int
from bertjax.model.config import ENCODER_DEFAULTS
from bertjax.settings import electra, multilingual
from bertjax.settings.config_keys import Section, fields_of, strict
from bertjax.settings.shared import MeshSettings, ModelSpec, mesh_settings, model_spec
from bertjax.train.memory_fit import MODES as FIT_MODES
from bertjax.train.optimizer import OptimizerConfig

# name: (next-sentence prediction, span boundary objective, example mode)
OBJECTIVES = {
    "bert": (True, False, "nsp"),
    # sentence-order prediction: the pair head tells consecutive segments from swapped ones
    "albert": (True, False, "sop"),
    "roberta": (False, False, "full_sentences"),
    "spanbert": (False, True, "full_sentences"),
    # replaced token detection: a generator's samples replace the masked tokens (settings/electra)
    "electra": (False, False, "full_sentences"),
}

# The objectives whose MLM head reads the encoder (model.enhanced_mask_decoder can feed it).
MASKED_LM_OBJECTIVES = ("bert", "roberta", "spanbert")


@dataclasses.dataclass(frozen=True)
class PretrainingObjective:
    name: str
    nsp: bool
    sbo: bool
    mode: str  # how examples are built: NSP or SOP pairs, or full sentences
    electra: electra.ElectraSettings | None  # objective "electra" only


@dataclasses.dataclass(frozen=True)
class CorpusSettings:
    """The data section: the raw text, how it is read and tokenized, and the prepared corpus."""

    # Raw text: files, directories or globs (comma-separated; .gz/.bz2 fine), or "tfds:NAME".
    input: str = ""
    # "sentences": one sentence a line, blank line between documents (google-research/bert);
    # "paragraphs": one paragraph a line, split into sentences; "mediawiki": a Wikipedia XML dump.
    input_format: str = "sentences"
    prepared: str = ""  # where the prepared corpus lives; empty: WORKDIR/data
    # An existing vocabulary (vocab.txt, spm .model, or a tokenizer directory); empty trains one.
    tokenizer: str = ""
    tokenizer_type: str = "wordpiece"  # wordpiece | sentencepiece | bpe (when training one)
    vocab_size: int = ENCODER_DEFAULTS["vocab_size"]  # BERT's 30,522
    lowercase: bool = True
    short_seq_prob: float = 0.1
    # objective roberta: keep the documents packed into a row apart (each attends to itself only,
    # positions restart), as ModernBERT packs; False is RoBERTa's, attending across them. Read
    # into the objective's example mode ("documents").
    separate_documents: bool = False
    eval_fraction: float = 0.01  # documents held out for evaluation
    # Multilingual pretraining, in place of data.input: "en=PATH_OR_GLOB,es=PATH" (a language
    # code per input), one vocabulary over all; see docs/data.md "Multilingual".
    languages: str = ""
    # Language sampling p_l ~ (share of the language's tokens)^alpha (mBERT 0.7, XLM-R 0.3).
    language_alpha: float = 0.7
    # XLM's translation language modelling: "en-es=PATH", a file of tab-separated translation
    # pairs (side A in the first language); read with data.tlm_fraction > 0.
    parallel: str = ""
    tlm_fraction: float = 0.0  # the share of rows that are translation pairs (the rest MLM)
    workers: int = 2  # background batch builders
    prefetch: int = 4  # batches built ahead of the step
    # A prepared corpus on a bucket is read in place (docs/cloud-storage.md): the token ranges of
    # the next read_ahead_steps steps are fetched ahead, holding at most cache_mb MiB of memory.
    read_ahead_steps: int = 4
    cache_mb: int = 256
    # Not a config key: whether data.vocab_size was set on the command line.
    vocab_size_given: bool = False

    def __post_init__(self):
        check_choice("data.input_format", self.input_format, INPUT_FORMATS)
        if not 0.0 <= self.eval_fraction < 1.0:
            raise UserError(f"data.eval_fraction must be in [0, 1), got {self.eval_fraction}")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise UserError(f"data.short_seq_prob must be in [0, 1], got {self.short_seq_prob}")
        check_int("data.workers", self.workers, 0, "(0: batches built in the training process)")
        check_int("data.prefetch", self.prefetch, 1)
        check_int("data.read_ahead_steps", self.read_ahead_steps, 1)
        check_int("data.cache_mb", self.cache_mb, 1)
        multilingual.check_corpus(self)

    def parallel_spec(self) -> tuple[str, str, str]:
        """(language A, language B, path) of the parallel text TLM reads."""
        return multilingual.parallel_spec(self)

    def inputs(self) -> tuple[list[str], str]:
        """The raw corpus inputs and their format; the demo corpus is fetched on first use."""
        raw = self.input.strip()
        if not raw:
            raise UserError("no corpus: set --config.data.input to text files, a directory, a "
                            f"glob or tfds:NAME (or a demo corpus: {', '.join(NAMED_INPUTS)})")
        if raw in NAMED_INPUTS:
            return [raw], "sentences"  # the demo corpora are written in this layout
        return [part.strip() for part in raw.split(",") if part.strip()], self.input_format

    def prepared_dir(self, workdir: str) -> str:
        return self.prepared or os.path.join(workdir, "data")


@dataclasses.dataclass(frozen=True)
class ScheduleSettings:
    """The schedule section, BERT's length schedule: short sequences first, long ones for the
    last `long_fraction` of the steps."""

    short_seq_len: int = 128
    short_max_predictions: int = 20
    long_seq_len: int = 512
    long_max_predictions: int = 80
    long_fraction: float = 0.1
    # model.position_embedding=rope: the global layers' rotary base in the short phase (0: the
    # model's, model.rope_theta, which the long phase and the trained model use).
    short_rope_theta: float = 0.0

    def __post_init__(self):
        if not 0.0 <= self.long_fraction <= 1.0:
            raise UserError(f"schedule.long_fraction must be in [0, 1], got {self.long_fraction}")
        # Both phases, even one that long_fraction leaves out (0 or 1): every value is checked.
        for phase in ("short", "long"):
            seq_len, predictions = (getattr(self, f"{phase}_seq_len"),
                                    getattr(self, f"{phase}_max_predictions"))
            check_int(f"schedule.{phase}_seq_len", seq_len, MIN_SEQ_LEN,
                      "([CLS] A [SEP] B [SEP])")
            check_int(f"schedule.{phase}_max_predictions", predictions, 1)
            if predictions > seq_len:
                raise UserError(f"schedule.{phase}_max_predictions {predictions} exceeds "
                                f"schedule.{phase}_seq_len {seq_len}")
        if not self.short_rope_theta >= 0:
            raise UserError(f"schedule.short_rope_theta must be >= 0 (0: the model's), got "
                            f"{self.short_rope_theta}")


@dataclasses.dataclass(frozen=True)
class PretrainLoop:
    """The train section: steps, batch, logging, checkpoints, evaluation and the time budget."""

    steps: int = 1_000_000
    batch_size: int = 256  # global, across all devices and hosts
    accumulation_steps: int = 1
    seed: int = 0
    log_every: int = 100
    checkpoint_every: int = 10_000
    keep_checkpoints: int = 3  # 0: keep all
    eval_every: int = 10_000
    eval_batches: int = 20
    plot: bool = False  # loss/accuracy curves to WORKDIR/curves.png
    # GiB one device holds, checked against the compiled step before the first step; 0 asks the
    # device (TPUs and GPUs report it, CPUs do not). Set it lower to keep headroom.
    device_memory_gb: float = 0.0
    # auto: a phase that does not fit a device gets, before step 1, the first setting of
    # model.remat, then train.accumulation_steps, then mesh.fsdp that fits every phase with 10%
    # headroom (bertjax/train/memory_fit.py), recorded in run.json and kept on resume; off: such
    # a config is refused in one line.
    fit: str = "auto"
    # Minutes of wall time to train for (0: train.steps decides). The learning-rate schedule is
    # then laid over the budget, train.steps is a cap, and the run checkpoints and stops once it
    # is spent (bertjax/train/time_budget.py; configs/budget.py).
    time_budget_minutes: float = 0.0
    # A checkpoint every so many minutes of wall time too (0: only every checkpoint_every steps).
    checkpoint_every_minutes: float = 0.0
    # Texts with [MASK] ("|" between them) the finished run fills in, top 5 each, on stderr.
    fill_mask_examples: str = ""
    # "START,END": a jax.profiler trace of steps START+1 to END into WORKDIR/profile (docs/
    # pretraining.md#step-records-and-profiling); empty: none.
    profile_steps: str = ""

    def profiled_steps(self) -> tuple[int, int] | None:
        """train.profile_steps as (START, END), None when empty; UserError when malformed."""
        text = str(self.profile_steps).strip()
        if not text:
            return None
        parts = [part.strip() for part in text.split(",")]
        if len(parts) != 2 or not all(part.isdigit() for part in parts) or \
                int(parts[0]) >= int(parts[1]):
            raise UserError(f"train.profile_steps must be START,END (step numbers, START < END),"
                            f" got {text!r}")
        first, last = int(parts[0]), int(parts[1])
        if first >= self.steps:
            raise UserError(f"train.profile_steps starts at step {first}, but the run ends at "
                            f"train.steps {self.steps}")
        return first, last


@dataclasses.dataclass(frozen=True)
class PretrainSettings:
    init_checkpoint: str
    objective: PretrainingObjective
    model: ModelSpec
    mesh: MeshSettings
    data: CorpusSettings
    masking: MaskingConfig
    schedule: LengthSchedule
    optimizer: OptimizerConfig
    train: PretrainLoop
    task: str  # "pretrain"


def read(config, overridden: frozenset = frozenset()) -> PretrainSettings:
    """`config`: a ConfigDict (or a Section of one); `overridden`: the keys given on the command
    line (--config.KEY=VALUE)."""
    config = strict(config)
    task = config.task
    if task != "pretrain":  # inspect and bench take this path for any config they are given
        raise UserError(f"this command takes a pretraining config (task pretrain, e.g. "
                        f"configs/base.py), got one of task {task!r}")
    objective = _objective(config)
    train = PretrainLoop(**fields_of(PretrainLoop, config.train, "train"))
    _check_loop(train)
    model = model_spec(config.model)
    if model.enhanced_mask_decoder and objective.name not in MASKED_LM_OBJECTIVES:
        raise UserError(f"model.enhanced_mask_decoder decodes a masked LM's predictions: "
                        f"objective {objective.name} has no plain MLM head to feed (use one of "
                        f"{', '.join(MASKED_LM_OBJECTIVES)})")
    schedule = _schedule(config, train.steps)
    if train.time_budget_minutes and len(schedule.phases) > 1:
        raise UserError("train.time_budget_minutes lays the learning rate over time, but the "
                        "length phases switch at a step: train one length "
                        "(schedule.long_fraction=0)")
    if objective.electra is not None and not model.from_checkpoint:
        # The generator's size and vocabulary, refused now; from a checkpoint, by the job.
        objective.electra.generator(model.encoder(vocab_size=config.data.vocab_size))
    longest = max(phase.seq_len for phase in schedule.phases)
    if longest > model.max_position_embeddings and not model.from_checkpoint:
        raise UserError(f"schedule sequence length {longest} exceeds "
                        f"model.max_position_embeddings {model.max_position_embeddings}")
    window = model.architecture["sliding_window"]
    if window > longest and not model.from_checkpoint:
        raise UserError(f"model.sliding_window {window} is wider than the longest sequence the "
                        f"schedule trains ({longest} tokens): every layer would be global")
    init = config.init_checkpoint.strip()
    if model.from_checkpoint and not init:
        raise UserError("model.preset=from_checkpoint takes the model shape from "
                        "config.init_checkpoint, which is not set")
    if config.data.tokenizer_type not in TOKENIZER_KINDS:
        raise UserError(f"unknown data.tokenizer_type {config.data.tokenizer_type!r}; choose one "
                        f"of {', '.join(TOKENIZER_KINDS)}")
    data = CorpusSettings(**fields_of(CorpusSettings, config.data, "data",
                                      skip=("vocab_size_given",)),
                          vocab_size_given="data.vocab_size" in overridden)
    check_read_cache(data, train.batch_size, longest)
    multilingual.check_language_ids(config, model)
    optimizer = OptimizerConfig(total_steps=train.steps, **fields_of(
        OptimizerConfig, config.optimizer, "optimizer", skip=("total_steps",)))
    return PretrainSettings(
        init_checkpoint=init, objective=objective, model=model,
        mesh=mesh_settings(config.mesh),
        data=data,
        masking=MaskingConfig(**fields_of(MaskingConfig, config.masking, "masking")),
        schedule=schedule, optimizer=optimizer, train=train, task=task)


def _objective(config: Section) -> PretrainingObjective:
    name = config.objective
    if name not in OBJECTIVES:
        raise UserError(f"unknown objective {name!r}; choose one of {', '.join(OBJECTIVES)}")
    nsp, sbo, mode = OBJECTIVES[name]
    if config.data.separate_documents:
        if mode != "full_sentences" or name == "electra":  # ELECTRA's generator reads no packs
            raise UserError(f"data.separate_documents keeps the documents packed into a row "
                            f"apart: objective {name} does not support it (roberta and "
                            f"spanbert do)")
        mode = "documents"
    if sbo and config.masking.strategy != "span":
        raise UserError("objective spanbert needs masking.strategy='span' (the span boundary "
                        f"objective predicts masked spans), got {config.masking.strategy!r}")
    generator = electra.read(config)  # checked whatever the objective: every value is
    return PretrainingObjective(name, nsp, sbo, mode, generator if name == "electra" else None)


def check_read_cache(data: CorpusSettings, batch_size: int, longest: int,
                     workdir: str = "") -> None:
    """A corpus on a bucket is streamed, whole steps fetched ahead: the cache must hold one
    step's reads. Called with the config alone (data.prepared) and again with the workdir, where
    a corpus prepared into it lives. A local corpus is memory-mapped and needs no cache."""
    if not storage_urls.is_url(data.prepared_dir(workdir)):
        return
    needed = read_ahead.step_bytes_bound(batch_size, longest)
    if data.cache_mb << 20 < needed:
        raise UserError(f"data.cache_mb {data.cache_mb} cannot hold one step's reads from a "
                        f"streamed corpus (up to {-(-needed >> 20)} MiB for {batch_size} "
                        f"rows of {longest} tokens); raise it")


def _check_loop(train: PretrainLoop) -> None:
    check_int("train.seed", train.seed, 0)
    for key in ("steps", "batch_size", "accumulation_steps"):
        if int(getattr(train, key)) <= 0:
            raise UserError(f"train.{key} must be positive, got {getattr(train, key)}")
    for key in ("log_every", "checkpoint_every", "eval_every", "eval_batches",
                "keep_checkpoints"):
        if int(getattr(train, key)) < 0:
            raise UserError(f"train.{key} must not be negative, got {getattr(train, key)}")
    for key in ("device_memory_gb", "time_budget_minutes", "checkpoint_every_minutes"):
        if not getattr(train, key) >= 0:
            raise UserError(f"train.{key} must not be negative, got {getattr(train, key)}")
    train.profiled_steps()
    check_choice("train.fit", train.fit, FIT_MODES)
    missing = [t for t in train.fill_mask_examples.split("|") if t.strip() and "[MASK]" not in t]
    if missing:
        raise UserError(f"train.fill_mask_examples: {missing[0].strip()!r} has no [MASK]")
    if train.batch_size % train.accumulation_steps:
        raise UserError(f"train.batch_size {train.batch_size} is not divisible by "
                        f"train.accumulation_steps {train.accumulation_steps}")


def _schedule(config: Section, steps: int) -> LengthSchedule:
    s = ScheduleSettings(**fields_of(ScheduleSettings, config.schedule, "schedule"))
    if s.short_rope_theta and config.model.position_embedding != "rope":
        raise UserError("schedule.short_rope_theta changes the rotary base of the short phase: "
                        "set model.position_embedding=rope, or leave it 0")
    return LengthSchedule.bert(steps, long_fraction=s.long_fraction,
                               short=(s.short_seq_len, s.short_max_predictions),
                               long=(s.long_seq_len, s.long_max_predictions),
                               short_rope_theta=float(s.short_rope_theta))
