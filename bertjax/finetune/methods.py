"""How much of the model a fine-tuning run trains: `finetune.method` and its settings.

    full         every parameter (the default; finetune.freeze_encoder trains the head only)
    adapter      Houlsby bottleneck adapters after attention and feed-forward (+ LayerNorms, head)
    lora         low-rank updates of the query and value projections (+ head)
    cloze        the whole model through the pretrained MLM head: a template with one [MASK] and
                 a verbalizer word per label (PET); classification only
    soft_prompt  prompt_length trainable vectors after [CLS] in the input embeddings, the
                 encoder frozen; the head trains: the [CLS] classifier, or, given a verbalizer,
                 the MLM head scoring the template's [MASK] as in cloze

The switch is read from the config by bertjax.settings.methods; the methods themselves live with
the model and the trainer.
"""

from __future__ import annotations

import dataclasses

from bertjax.core.errors import UserError, check_choice
from bertjax.finetune import cloze
from bertjax.model.config import EncoderConfig

METHODS = ("full", "adapter", "lora", "cloze", "soft_prompt")
# The trainer's own list; a method lands here with its implementation.
IMPLEMENTED = ("full", "adapter", "lora", "cloze", "soft_prompt")
PARAMETER_EFFICIENT = ("adapter", "lora")  # modules added to a frozen pretrained encoder


@dataclasses.dataclass(frozen=True)
class MethodSettings:
    """The `finetune` section's method keys (configs/finetune_base.py gives their defaults)."""

    name: str  # finetune.method
    adapter_size: int
    lora_rank: int
    lora_alpha: float
    lora_dropout: float
    prompt_length: int
    template: str
    verbalizer: str  # "label:word,label:word"

    def __post_init__(self):
        check_choice("finetune.method", self.name, METHODS)
        if self.name not in IMPLEMENTED:
            raise UserError(f"finetune.method={self.name} is not available in this version "
                            f"(available: {', '.join(IMPLEMENTED)})")
        # Each method's keys are checked whichever method runs: a bad value is never kept.
        for key, method in (("adapter_size", "adapter"), ("lora_rank", "lora"),
                            ("prompt_length", "soft_prompt")):
            value = getattr(self, key)
            if value < 0 or (self.name == method and value == 0):
                raise UserError(f"finetune.{key} must be positive, got {value}")
        if not self.lora_alpha > 0:
            raise UserError(f"finetune.lora_alpha must be positive, got {self.lora_alpha}")
        if not 0.0 <= self.lora_dropout < 1.0:
            raise UserError(f"finetune.lora_dropout must be in [0, 1), got {self.lora_dropout}")
        if self.name == "cloze" and not self.verbalizer.strip():
            raise UserError("finetune.method=cloze needs finetune.verbalizer, one vocabulary word "
                            "per label: e.g. --config.finetune.verbalizer="
                            "negative:terrible,positive:great")
        cloze.parse_template(self.template)  # read by cloze methods only; checked always
        if self.verbalizer.strip():
            cloze.parse_verbalizer(self.verbalizer)

    @property
    def cloze(self) -> bool:
        """Whether labels are scored by the MLM head at the template's [MASK]."""
        with_verbalizer = self.name == "soft_prompt" and bool(self.verbalizer.strip())
        return self.name == "cloze" or with_verbalizer

    @property
    def prompt(self) -> int:
        """The soft prompt's length (0: none)."""
        return self.prompt_length if self.name == "soft_prompt" else 0

    @property
    def freezes_base(self) -> bool:
        return self.name in PARAMETER_EFFICIENT

    def encoder(self, base: EncoderConfig) -> EncoderConfig:
        """`base` (the init checkpoint's or a preset's shape, whatever adaptation it recorded)
        with this method's adapters or LoRA, or none; a LoRA rank above the hidden size is
        refused by name."""
        if self.name == "lora" and self.lora_rank > base.hidden_size:
            raise UserError(f"finetune.lora_rank {self.lora_rank} is larger than the model's "
                            f"hidden size {base.hidden_size}")
        plain = base.without_adaptation()
        if self.name == "adapter":
            return plain.replace(adapter_size=self.adapter_size)
        if self.name == "lora":
            return plain.replace(lora_rank=self.lora_rank, lora_alpha=self.lora_alpha,
                                 lora_dropout=self.lora_dropout)
        return plain

    def check_with(self, *, freeze_encoder: bool, reinit_top_layers: int,
                   init_checkpoint: str) -> None:
        """Refuses the fine-tuning settings this method contradicts."""
        if not self.freezes_base:
            return
        if freeze_encoder:
            raise UserError(f"finetune.freeze_encoder=True stops every gradient at the encoder, "
                            f"so finetune.method={self.name} would train nothing inside it; "
                            "the method already freezes the base weights: drop freeze_encoder")
        if reinit_top_layers:
            raise UserError(f"finetune.reinit_top_layers={reinit_top_layers} with "
                            f"finetune.method={self.name} would leave the re-initialized layers "
                            "frozen at random values; set it to 0")
        if not init_checkpoint:
            raise UserError(f"finetune.method={self.name} adapts a pretrained encoder and "
                            "freezes it: set config.init_checkpoint")
