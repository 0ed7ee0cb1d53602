"""Fine-tuning settings: the task, its data and columns, the loop and the optimizer, all checked
here, before any file is read or written."""

from __future__ import annotations

import dataclasses
import math

from bertjax.core.errors import UserError
from bertjax.finetune import cloze
from bertjax.finetune.distillation import DistillSettings
from bertjax.finetune.methods import MethodSettings
from bertjax.finetune.readers import FORMATS as READER_FORMATS, Columns, Source
from bertjax.finetune.tasks import TaskSettings, task_class
from bertjax.settings import distill, methods
from bertjax.settings.config_keys import fields_of, strict
from bertjax.settings.finetune_sections import FinetuneData, FinetuneOptions, TrainSettings
from bertjax.settings.shared import MeshSettings, ModelSpec, mesh_settings, model_spec
from bertjax.train.optimizer import OptimizerConfig

MODES = ("train", "predict")


@dataclasses.dataclass(frozen=True)
class DataSettings:
    train: str
    eval: str
    predict: str
    format: str
    columns: Columns
    tokenizer: str
    max_train_examples: int
    max_train_examples_per_class: int  # classification: a fixed sample of k per label (few-shot)
    max_eval_examples: int
    tfds_data_dir: str | None

    def source(self, path: str, *, labeled: bool, regression: bool) -> Source:
        return Source(path, self.format, self.columns, labeled=labeled, regression=regression,
                      tfds_data_dir=self.tfds_data_dir)


@dataclasses.dataclass(frozen=True)
class FinetuneSettings:
    task: str
    mode: str
    init_checkpoint: str
    predict_output: str
    reinit_top_layers: int
    freeze_encoder: bool
    method: MethodSettings
    data: DataSettings
    train: TrainSettings
    task_settings: TaskSettings
    optimizer: dict  # OptimizerConfig fields but total/warmup steps (known once data is read)
    warmup_fraction: float
    model: ModelSpec
    mesh: MeshSettings
    distill: DistillSettings | None  # a `distill` section: the student of a teacher run

    def optimizer_config(self, total_steps: int) -> OptimizerConfig:
        # Rounded up, as transformers' Trainer does (TrainingArguments.get_warmup_steps): a
        # fraction of a step still warms up, and both frameworks then apply the same rates.
        warmup = min(math.ceil(total_steps * self.warmup_fraction), total_steps)
        try:
            return OptimizerConfig(total_steps=total_steps, warmup_steps=warmup, **self.optimizer)
        except TypeError as e:  # an optimizer key OptimizerConfig does not have
            raise UserError(f"bad optimizer setting: {e}") from None


def read(config, *, require_data: bool = True) -> FinetuneSettings:
    """Typed settings from a ConfigDict (or a Section of one); `require_data=False` checks a
    config file alone (no data paths needed)."""
    config = strict(config)
    if config.mode not in MODES:
        raise UserError(f"mode must be one of {', '.join(MODES)}, got {config.mode!r}")
    task_class(config.task)  # an unknown task name is refused by name
    d = FinetuneData(**fields_of(FinetuneData, config.data, "data"))
    f = FinetuneOptions(**fields_of(FinetuneOptions, config.finetune, "finetune"))
    data = _data(d, config.task)
    train = _train(config.train)
    if require_data and config.mode == "train" and not (data.train and data.eval):
        raise UserError("fine-tuning needs data.train and data.eval (the dev set picks the best "
                        "checkpoint): set --config.data.train=PATH --config.data.eval=PATH")
    if require_data and config.mode == "predict" and not data.predict:
        raise UserError("predict mode needs --config.data.predict=PATH")
    if f.reinit_top_layers < 0:
        raise UserError(f"finetune.reinit_top_layers must be >= 0, got {f.reinit_top_layers}")
    method = methods.read(f)
    _check_method(method, config.task, f.freeze_encoder, d.max_seq_len)
    task = _task_settings(d, f, train, method)
    if config.task == "finetune_retrieval":
        _check_retrieval(d, f)
    if config.task == "finetune_qa" and d.max_seq_len - d.max_query_length - 3 < 1:
        raise UserError(f"data.max_seq_len {d.max_seq_len} leaves no room for the context after "
                        f"a question of data.max_query_length {d.max_query_length} tokens")
    # total_steps and warmup_steps are known once the data is read (warmup_fraction of them).
    optimizer = fields_of(OptimizerConfig, config.optimizer, "optimizer",
                          skip=("total_steps", "warmup_steps"), beside=("warmup_fraction",))
    fraction = config.optimizer.warmup_fraction
    if not 0.0 <= fraction <= 1.0:
        raise UserError(f"optimizer.warmup_fraction must be in [0, 1], got {fraction}")
    model = model_spec(config.model)
    if model.enhanced_mask_decoder:
        raise UserError("model.enhanced_mask_decoder is a pretraining head: fine-tuning reads "
                        "the encoder alone; leave it 0")
    if not model.from_checkpoint and d.max_seq_len > model.max_position_embeddings:
        raise UserError(f"data.max_seq_len {d.max_seq_len} exceeds "
                        f"model.max_position_embeddings {model.max_position_embeddings}")
    init = config.init_checkpoint.strip()
    if config.mode == "train":
        method.check_with(freeze_encoder=f.freeze_encoder, reinit_top_layers=f.reinit_top_layers,
                          init_checkpoint=init)
        if not model.from_checkpoint:  # the shape is known now (else: at the init checkpoint)
            method.encoder(model.encoder(vocab_size=1000))
        if f.reinit_top_layers and model.share_layers:
            raise UserError(f"finetune.reinit_top_layers={f.reinit_top_layers} re-initializes the "
                            "top layers, but model.share_layers gives every layer the same "
                            "parameters: set one of them to 0/False")
    result = FinetuneSettings(config.task, config.mode, init, config.predict_output,
                              f.reinit_top_layers, f.freeze_encoder, method, data,
                              train, task,
                              optimizer, fraction, model, mesh_settings(config.mesh),
                              distill.read(config, crf=f.crf, require_teacher=require_data,
                                           init_checkpoint=init,
                                           from_checkpoint=model.from_checkpoint))
    result.optimizer_config(max(train.steps, 1))  # refuses bad optimizer settings by name
    if train.packing:
        _check_packing(result)
    return result


def _data(d: FinetuneData, task: str) -> DataSettings:
    data = DataSettings(
        train=d.train.strip(), eval=d.eval.strip(), predict=d.predict.strip(),
        format=d.format.strip(),
        columns=Columns(d.text_column, d.text_pair_column, d.label_column, d.id_column,
                        d.span_start_column, d.span_end_column, d.negative_column),
        tokenizer=d.tokenizer, max_train_examples=d.max_train_examples,
        max_train_examples_per_class=d.max_train_examples_per_class,
        max_eval_examples=d.max_eval_examples, tfds_data_dir=d.tfds_data_dir or None)
    for key in ("max_train_examples", "max_train_examples_per_class", "max_eval_examples"):
        if getattr(data, key) < 0:
            raise UserError(f"data.{key} must not be negative (0: all), got "
                            f"{getattr(data, key)}")
    if data.format and data.format not in READER_FORMATS:
        raise UserError(f"data.format must be one of {', '.join(READER_FORMATS)} (or empty: "
                        f"from the file extension), got {data.format!r}")
    if data.max_train_examples_per_class and task != "finetune_classification":
        raise UserError("data.max_train_examples_per_class samples classes: it needs "
                        f"task=finetune_classification, not {task}")
    return data


def _train(section) -> TrainSettings:
    train = TrainSettings(**fields_of(TrainSettings, section, "train"))
    train = dataclasses.replace(train, eval_batch_size=train.eval_batch_size or train.batch_size)
    _check_train(train)
    return train


def _task_settings(d: FinetuneData, f: FinetuneOptions, train: TrainSettings,
                   method: MethodSettings) -> TaskSettings:
    """What the task's features, model and decoding take from the data and finetune sections."""
    labels = tuple(x.strip() for x in d.labels.split(",") if x.strip())
    positive = d.positive_label.strip()
    if positive and labels and positive not in labels:
        raise UserError(f"data.positive_label {positive!r} is not one of data.labels "
                        f"({', '.join(labels)})")
    verbalizer = ",".join(f"{label}:{word}" for label, word in
                          cloze.parse_verbalizer(method.verbalizer).items()) if method.cloze else ""
    return TaskSettings(max_seq_len=d.max_seq_len, labels=labels, positive_label=positive,
                        main_metric=train.main_metric, all_subwords=f.label_all_subwords,
                        crf=f.crf, doc_stride=d.doc_stride, max_query_length=d.max_query_length,
                        max_answer_length=d.max_answer_length, prompt_length=method.prompt,
                        template=method.template if method.cloze else "", verbalizer=verbalizer,
                        span_pooling=f.span_pooling, qa_scorer=f.qa_scorer, pooling=f.pooling,
                        separate_encoders=f.separate_encoders, temperature=f.temperature)


def _check_method(method: MethodSettings, task: str, freeze_encoder: bool,
                  max_seq_len: int) -> None:
    """The methods' limits that the config alone shows (the vocabulary and the labels are
    checked once the data is read)."""
    if method.cloze:
        allowed, what = ("finetune_classification",), f"finetune.method={method.name}"
        if method.name == "soft_prompt":
            what += " with a verbalizer"
    elif method.name == "soft_prompt":
        allowed = ("finetune_classification", "finetune_regression")
        what = "finetune.method=soft_prompt"
    else:
        allowed, what = (task,), ""
    if task not in allowed:
        raise UserError(f"{what} works with task={' or '.join(allowed)}, not {task}")
    if freeze_encoder and method.name != "full":
        raise UserError(f"finetune.freeze_encoder belongs to finetune.method=full; "
                        f"method={method.name} decides itself what trains")
    if method.prompt + 3 > max_seq_len:
        raise UserError(f"finetune.prompt_length {method.prompt} leaves no room for text in "
                        f"data.max_seq_len {max_seq_len} ([CLS], the prompt, a token and [SEP] "
                        f"need {method.prompt + 3})")


def _check_packing(s: FinetuneSettings) -> None:
    """Packing pools each sequence's own [CLS] in SequenceClassifier: what a soft prompt (its
    vectors after the row's first [CLS]), a cloze head (one [MASK] a row) or a teacher's logits
    (one row each) have no slot for."""
    if task_class(s.task).packed_batch is None:
        raise UserError("train.packing works with task=finetune_classification or "
                        f"finetune_regression (sentences and pairs), not {s.task}")
    if s.method.prompt or s.method.cloze:
        raise UserError(f"train.packing does not work with finetune.method={s.method.name}")
    if s.distill is not None:
        raise UserError("train.packing does not work with distillation (the distill section)")


def _check_retrieval(d: FinetuneData, f: FinetuneOptions) -> None:
    if not d.text_pair_column:
        raise UserError("retrieval needs data.text_pair_column (the positive document's column; "
                        "data.text_column is the query's)")
    if d.max_query_length > d.max_seq_len:
        raise UserError(f"data.max_query_length {d.max_query_length} exceeds data.max_seq_len "
                        f"{d.max_seq_len} (queries are rows of max_query_length tokens)")
    if f.freeze_encoder:
        raise UserError("finetune.freeze_encoder would leave a dual encoder nothing to train")


def _check_train(t: TrainSettings) -> None:
    if t.seed < 0:
        raise UserError(f"train.seed must not be negative, got {t.seed}")
    for name in ("batch_size", "eval_batch_size", "accumulation_steps", "restarts"):
        if getattr(t, name) <= 0:
            raise UserError(f"train.{name} must be positive, got {getattr(t, name)}")
    for name in ("epochs", "steps", "log_every", "checkpoint_every", "bucket_multiple"):
        if getattr(t, name) < 0:
            raise UserError(f"train.{name} must not be negative, got {getattr(t, name)}")
    if t.batch_size % t.accumulation_steps:
        raise UserError(f"train.batch_size {t.batch_size} is not divisible by "
                        f"train.accumulation_steps {t.accumulation_steps}")
