"""A fine-tuning run's starting point: the encoder's shape, the tokenizer and the init checkpoint
(with its parameters when the run starts fresh), every refusal made before anything is written.
Shared by training, distillation (a student cut from its teacher) and the fine-tuning benchmark."""

from __future__ import annotations

import dataclasses

from bertjax.core.errors import UserError
from bertjax.data.tokenizer import Tokenizer, load_tokenizer
from bertjax.inference import loading
from bertjax.model import adaptation
from bertjax.model.config import EncoderConfig
from bertjax.settings.finetune import FinetuneSettings


@dataclasses.dataclass
class StartingPoint:
    """Where a run starts: the encoder's shape, the tokenizer and the init checkpoint (with its
    parameters when some run still starts fresh)."""

    encoder: EncoderConfig
    tokenizer: Tokenizer
    source: loading.Loaded | None


def starting_point(s: FinetuneSettings, *, with_params: bool = True,
                   source: loading.Loaded | None = None) -> StartingPoint:
    """Refuses a tokenizer that does not fit the embeddings, or a model too short for the data.
    `source` stands for init_checkpoint when given (a distillation student's teacher layers)."""
    if s.model.from_checkpoint and not (s.init_checkpoint or source):
        raise UserError("set config.init_checkpoint (a pretraining workdir or params export) "
                        "or, to train from scratch, a model.preset and data.tokenizer")
    if source is None and s.init_checkpoint:
        source = (loading.load if with_params else loading.describe)(s.init_checkpoint)
    if source is not None:
        recorded = source.require_encoder()
    else:
        recorded = None
    if not s.data.tokenizer and (source is None or not source.has_tokenizer):
        raise UserError(f"no tokenizer: {s.init_checkpoint or 'training from scratch'} records "
                        "none; set --config.data.tokenizer to the vocabulary")
    tokenizer = (source.tokenizer(s.data.tokenizer) if source
                 else load_tokenizer(s.data.tokenizer))
    encoder = s.method.encoder(s.model.encoder(tokenizer.vocab_size, tokenizer.special.pad,
                                               recorded))
    if recorded is not None:
        _adapted_source(s, source, recorded, encoder)
    if s.reinit_top_layers and encoder.share_layers:
        raise UserError(f"finetune.reinit_top_layers={s.reinit_top_layers}: the model's layers "
                        "share one layer's parameters (model.share_layers), so no top layer can "
                        "be re-initialized alone; set it to 0")
    if tokenizer.vocab_size != encoder.vocab_size:
        named = s.data.tokenizer or f"of {s.init_checkpoint}"
        raise UserError(f"vocabulary mismatch: the tokenizer {named} has "
                        f"{tokenizer.vocab_size} tokens, the model from "
                        f"{s.init_checkpoint or 'the config'} embeds {encoder.vocab_size}; use "
                        "the checkpoint's own vocabulary")
    if s.task_settings.max_seq_len > encoder.max_sequence_length:
        raise UserError(f"data.max_seq_len {s.task_settings.max_seq_len} exceeds the model's "
                        f"{encoder.max_sequence_length} positions (max_position_embeddings "
                        f"{encoder.max_position_embeddings})")
    return StartingPoint(encoder, tokenizer, source)


def _adapted_source(s: FinetuneSettings, source: loading.Loaded, recorded: EncoderConfig,
                    encoder: EncoderConfig) -> None:
    """An init checkpoint with LoRA starts a run without it merged (the model it is); one with
    adapters starts only another adapter run (dropping them would change the model)."""
    if recorded.adapter_size and not encoder.adapter_size:
        raise UserError(f"the init checkpoint {s.init_checkpoint} has adapters, which "
                        f"finetune.method={s.method.name} would drop; continue it with "
                        "finetune.method=adapter or start from its base")
    if recorded.lora_rank and not encoder.lora_rank and source.params is not None:
        source.params, _ = adaptation.merge_lora(source.params, recorded)
