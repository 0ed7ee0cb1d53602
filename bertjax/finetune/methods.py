"""How much of the model a fine-tuning run trains: `finetune.method` and its settings.

    full         every parameter (the default; finetune.freeze_encoder trains the head only)
    adapter      Houlsby bottleneck adapters after attention and feed-forward (+ LayerNorms, head)
    lora         low-rank updates of the query and value projections (+ head)
    cloze        the whole model through the pretrained MLM head: a template with one [MASK] and
                 a verbalizer word per label (PET); classification only
    soft_prompt  prompt_length trainable vectors after [CLS] in the input embeddings, the
                 encoder frozen; the head trains: the [CLS] classifier, or, given a verbalizer,
                 the MLM head scoring the template's [MASK] as in cloze

The switch is read here once; the methods themselves live with the model and the trainer.
"""

from __future__ import annotations

import dataclasses

from bertjax.errors import UserError, check_choice
from bertjax.finetune import cloze

METHODS = ("full", "adapter", "lora", "cloze", "soft_prompt")
# The trainer's own list; a method lands here with its implementation.
IMPLEMENTED = ("full", "cloze", "soft_prompt")


@dataclasses.dataclass(frozen=True)
class MethodSettings:
    name: str = "full"
    adapter_size: int = 64
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    prompt_length: int = 20
    template: str = "{text} It was [MASK]."
    verbalizer: str = ""  # "label:word,label:word"

    def __post_init__(self):
        check_choice("finetune.method", self.name, METHODS)
        if self.name not in IMPLEMENTED:
            raise UserError(f"finetune.method={self.name} is not available in this version "
                            f"(available: {', '.join(IMPLEMENTED)})")
        if self.name == "adapter" and self.adapter_size <= 0:
            raise UserError(f"finetune.adapter_size must be positive, got {self.adapter_size}")
        if self.name == "lora":
            if self.lora_rank <= 0:
                raise UserError(f"finetune.lora_rank must be positive, got {self.lora_rank}")
            if self.lora_alpha <= 0:
                raise UserError(f"finetune.lora_alpha must be positive, got {self.lora_alpha}")
            if not 0.0 <= self.lora_dropout < 1.0:
                raise UserError(f"finetune.lora_dropout must be in [0, 1), got "
                                f"{self.lora_dropout}")
        if self.name == "soft_prompt" and self.prompt_length <= 0:
            raise UserError(f"finetune.prompt_length must be positive, got {self.prompt_length}")
        if self.name == "cloze" and not self.verbalizer.strip():
            raise UserError("finetune.method=cloze needs finetune.verbalizer, one vocabulary word "
                            "per label: e.g. --config.finetune.verbalizer="
                            "negative:terrible,positive:great")
        if self.cloze:
            cloze.parse_template(self.template)
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


def read(finetune_config) -> MethodSettings:
    """MethodSettings from the config's `finetune` block (keys it lacks keep their defaults)."""
    names = [field.name for field in dataclasses.fields(MethodSettings) if field.name != "name"]
    given = {name: finetune_config[name] for name in names if name in finetune_config}
    return MethodSettings(name=finetune_config.get("method", "full"), **given)
