"""The fine-tuning config's own sections (finetune, data, train), each key with its default and
meaning; configs/finetune_base.py builds them with `defaults.section`. A key that a lower dataclass
reads and checks takes its default from there: the task's settings (TaskSettings), the columns of
a source (Columns, Source), LoRA's scale and dropout (EncoderConfig), the length buckets."""

from __future__ import annotations

import dataclasses

from bertjax.core import length_buckets
from bertjax.finetune.readers import Columns, Source
from bertjax.finetune.tasks import TaskSettings
from bertjax.model.config import ENCODER_DEFAULTS


def _default(cls, name: str):
    """The default of `cls`'s field `name`, where it is written (and checked)."""
    return next(f.default for f in dataclasses.fields(cls) if f.name == name)


def _task(name: str):
    return _default(TaskSettings, name)


def _column(name: str):
    return _default(Columns, name)


@dataclasses.dataclass(frozen=True)
class FinetuneOptions:
    """The finetune section: what trains, and the task heads' options."""

    reinit_top_layers: int = 0  # re-initialize the top k encoder layers (+ pooler)
    freeze_encoder: bool = False  # feature-based: train the head only
    crf: bool = _task("crf")  # token classification: a linear-chain CRF
    # Token classification: every subword tagged (else the first only).
    label_all_subwords: bool = _task("all_subwords")
    # What trains (bertjax/finetune/methods.py): full | adapter | lora | cloze | soft_prompt
    method: str = "full"
    adapter_size: int = 64  # adapter: bottleneck width
    lora_rank: int = 8  # lora: rank, scale alpha / rank, dropout on its input
    lora_alpha: float = ENCODER_DEFAULTS["lora_alpha"]
    lora_dropout: float = ENCODER_DEFAULTS["lora_dropout"]
    prompt_length: int = 20  # soft_prompt: trainable vectors after [CLS]
    # cloze (and soft_prompt given a verbalizer): one [MASK], {text} (and {text_pair}) filled in
    template: str = "{text} It was [MASK]."
    verbalizer: str = _task("verbalizer")  # "label:word,..." (one vocabulary token each)
    # span classification and QA's span scorer: mean | attention (a learned score per token)
    span_pooling: str = _task("span_pooling")
    # QA: start_end (BERT's start + end logits) | span (an MLP over every candidate span)
    qa_scorer: str = _task("qa_scorer")
    pooling: str = _task("pooling")  # retrieval: mean | cls of the last layer
    separate_encoders: bool = _task("separate_encoders")  # retrieval: a document encoder too
    temperature: float = _task("temperature")  # retrieval: softmax over cosine / temperature


@dataclasses.dataclass(frozen=True)
class FinetuneData:
    """The data section: where the examples are, their columns, and the features' lengths."""

    # Files (or packaged:NAME:SPLIT, tfds:NAME:SPLIT); eval picks the best checkpoint.
    train: str = ""
    eval: str = ""
    predict: str = ""
    # tsv | csv | jsonl | conll | squad; empty: from the file extension
    format: str = _default(Source, "format")
    text_column: str = _column("text")
    text_pair_column: str = _column("text_pair")  # e.g. sentence2 for a pair task
    label_column: str = _column("label")
    id_column: str = _column("id")  # empty: row numbers
    negative_column: str = _column("negative")  # retrieval: a hard negative document
    # span classification: the span's character offsets in the text (end exclusive)
    span_start_column: str = _column("span_start")
    span_end_column: str = _column("span_end")
    # Comma-separated label order (ids); empty: the training set's labels sorted (a TFDS
    # ClassLabel's own name order for tfds: sources).
    labels: str = ""
    # Binary classification: the label whose F1 is reported (one of the labels); empty: the
    # second label of the order ("1" for labels 0,1; "equivalent" for tfds:glue/mrpc).
    positive_label: str = _task("positive_label")
    tokenizer: str = ""  # empty: the init checkpoint's
    max_seq_len: int = _task("max_seq_len")
    max_train_examples: int = 0  # 0: all
    max_train_examples_per_class: int = 0  # few-shot: a fixed k per label; 0: all
    max_eval_examples: int = 0
    doc_stride: int = _task("doc_stride")  # QA
    max_query_length: int = _task("max_query_length")  # QA; retrieval: the query rows' length
    max_answer_length: int = _task("max_answer_length")  # QA
    tfds_data_dir: str = ""


@dataclasses.dataclass(frozen=True)
class TrainSettings:
    """The train section (Devlin et al.'s fine-tuning: 3 epochs of batch 32)."""

    epochs: int = 3  # 0 (steps 0): evaluate the start only (zero-shot)
    steps: int = 0  # 0: epochs x steps per epoch
    batch_size: int = 32  # global
    eval_batch_size: int = 0  # 0: batch_size (read as batch_size)
    accumulation_steps: int = 1
    seed: int = 0
    restarts: int = 1  # N > 1: N seeds in WORKDIR/restart_K, best kept
    main_metric: str = _task("main_metric")  # what picks the best checkpoint; empty: the task's
    log_every: int = 50
    checkpoint_every: int = 0  # extra mid-epoch checkpoints; 0: epoch ends only
    # Each batch cut to the smallest multiple of this many tokens that holds its longest row
    # (one compiled step per length; training batches drawn from length-sorted windows of the
    # shuffled epoch); 0: every batch padded to max_seq_len.
    bucket_multiple: int = length_buckets.DEFAULT_MULTIPLE
    # Sentence (pair) classification and regression: each training row of max_seq_len tokens
    # packs as many whole sequences as fit, each attending only to itself (bertjax/finetune/
    # packing.py), so short sentences stop paying for padding; batch_size then counts packed
    # rows (fewer steps an epoch). Evaluation and prediction stay unpacked (length-bucketed).
    packing: bool = False

    def buckets(self, max_seq_len: int) -> tuple[int, ...]:
        return length_buckets.bucket_lengths(self.bucket_multiple, max_seq_len)
