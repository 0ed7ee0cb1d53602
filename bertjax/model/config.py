"""The encoder's shape and numerics, as one frozen dataclass, and the named presets.

The presets below `base` follow Google's BERT miniatures (Turc et al., 2019).
"""

from __future__ import annotations

import dataclasses
import math

from bertjax.core.errors import UserError, check_choice

REMAT_POLICIES = ("none", "full", "save_dots")
DTYPES = ("float32", "bfloat16", "float16")
# bertjax/model/attention_choice.py says what each picks.
ATTENTION_IMPLEMENTATIONS = ("auto", "xla", "cudnn", "splash", "explicit")
# The fused kernels compute no attention probabilities, so none can be dropped.
FUSED_ATTENTION = ("cudnn", "splash")
# "relative": DeBERTa's disentangled attention (model/disentangled_attention.py), no absolute
# positions anywhere.
POSITION_EMBEDDINGS = ("learned", "rope", "relative")
# The kernels that can add DeBERTa's position terms: it spells its attention out.
RELATIVE_ATTENTION = ("auto", "", "explicit")
NORM_PLACEMENTS = ("post", "pre")
MLP_KINDS = ("gelu", "geglu")
# The activation of the feed-forward layers and the MLM head: exact erf GELU (BERT) or its tanh
# approximation (Hugging Face's "gelu_new", ALBERT's).
ACTIVATIONS = ("gelu", "gelu_tanh")
# The architecture options of modern encoders (ModernBERT, Warner et al. 2024), BERT's by default
# (ARCHITECTURE_DEFAULTS, below the class). A record written before they existed lacks them, and
# one that keeps BERT's values leaves them out (`record()`).
ARCHITECTURE_FIELDS = ("position_embedding", "rope_theta", "rope_local_theta", "norm", "mlp",
                       "use_bias", "norm_bias", "global_attention_every", "sliding_window",
                       "positions_from_padding", "embedding_size", "share_layers", "activation",
                       "position_buckets", "max_relative_positions")


@dataclasses.dataclass(frozen=True)
class EncoderConfig:
    vocab_size: int = 30522
    hidden_size: int = 768
    num_layers: int = 12
    num_heads: int = 12
    intermediate_size: int = 3072
    max_position_embeddings: int = 512
    type_vocab_size: int = 2
    hidden_dropout: float = 0.1
    attention_dropout: float = 0.1
    layer_norm_eps: float = 1e-12
    initializer_range: float = 0.02
    pad_token_id: int = 0
    # BERT is every default below. ModernBERT: rotary positions (theta per attention kind, the
    # global layers' first), pre-norm with a norm after the embeddings and after the last layer,
    # GeGLU (`intermediate_size` is then the up projection's width, value and gate halves), no
    # biases in the dense layers or norms, and every `global_attention_every`-th layer global
    # (layer 0 first) while the others see only keys within `sliding_window` // 2 positions.
    position_embedding: str = "learned"
    rope_theta: float = 10_000.0
    rope_local_theta: float = 10_000.0
    norm: str = "post"
    mlp: str = "gelu"
    use_bias: bool = True
    norm_bias: bool = True
    global_attention_every: int = 1
    sliding_window: int = 0
    # RoBERTa / XLM-R (Hugging Face's create_position_ids_from_input_ids): a token's position is
    # pad_token_id + 1 + its index among the row's non-padding tokens, and padding sits at
    # pad_token_id. The position table then has pad_token_id + 1 rows before the first token's,
    # so max_position_embeddings counts them and a sequence holds `max_sequence_length` tokens.
    positions_from_padding: bool = False
    # ALBERT (Lan et al., 2020; bertjax/model/albert.py): word, position and segment tables of
    # width embedding_size, projected to hidden_size after their LayerNorm (0: no projection, the
    # tables are hidden_size wide), one layer's parameters applied num_layers times, and the tanh
    # GELU of Hugging Face's "gelu_new".
    embedding_size: int = 0
    share_layers: bool = False
    activation: str = "gelu"
    # DeBERTa-v2/v3 (position_embedding="relative"): relative distances in log buckets beyond
    # position_buckets // 2 up to max_relative_positions (0: max_position_embeddings), one table
    # of 2 x position_buckets relative embeddings (2 x max_relative_positions when
    # position_buckets is 0: no buckets) shared by every layer.
    position_buckets: int = 256
    max_relative_positions: int = 0
    # Compute and parameter dtypes are separate: bf16 matmuls with fp32 master weights. Softmax,
    # LayerNorm and the losses always run in fp32.
    dtype: str = "float32"
    param_dtype: str = "float32"
    # The operands of the dense layers' and the tied output layer's matmuls, when not the compute
    # dtype ("" = dtype): "bfloat16" with dtype "float32" multiplies bf16 operands into fp32
    # results and keeps every activation, GELU, softmax and LayerNorm in fp32. On a CPU with
    # AVX512-BF16 a BERT-base step runs faster so (1.7-2x fp32) than in fp32 or all-bf16, whose
    # element-wise work XLA's CPU backend widens and narrows again around every op; on the CPU
    # the products' gradients go through model/low_precision_matmul.py (docs/speed.md).
    matmul_dtype: str = ""
    # The attention kernel (model/attention_choice.py): "auto" picks by the platform compiled
    # for (TPU: Pallas splash attention; GPU: cuDNN where it applies; CPU: XLA), "xla", "cudnn",
    # "splash" or "explicit" force one. With attention dropout in training `auto` spells the
    # probabilities out ("explicit"); cudnn and splash refuse attention dropout.
    attention_implementation: str = "auto"
    # nn.scan over layers: one compiled layer body instead of L copies (faster compiles).
    scan_layers: bool = False
    remat: str = "none"
    # Parameter-efficient fine-tuning (bertjax/model/adaptation.py), off at 0: Houlsby adapters
    # of this bottleneck width, LoRA of this rank on the query and value projections. Both add
    # parameters beside the base ones and rename none, so a base checkpoint loads unchanged.
    adapter_size: int = 0
    lora_rank: int = 0
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0

    def __post_init__(self):
        positive = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                    "max_position_embeddings")
        for name in positive:
            if getattr(self, name) <= 0:
                raise UserError(f"model.{name} must be positive, got {getattr(self, name)}")
        if self.type_vocab_size < 0:
            raise UserError(f"model.type_vocab_size must be >= 0 (0: no segment embeddings), got "
                            f"{self.type_vocab_size}")
        if self.layer_norm_eps <= 0:
            raise UserError(f"model.layer_norm_eps must be positive, got {self.layer_norm_eps}")
        self._check_architecture()
        if self.hidden_size % self.num_heads:
            raise UserError(f"model.hidden_size {self.hidden_size} is not divisible by "
                            f"model.num_heads {self.num_heads}")
        for name in ("hidden_dropout", "attention_dropout"):
            if not 0.0 <= getattr(self, name) < 1.0:
                raise UserError(f"model.{name} must be in [0, 1), got {getattr(self, name)}")
        check_choice("model.remat", self.remat, REMAT_POLICIES)
        if self.attention_implementation:  # "" (the backend's choice, in records) is auto
            check_choice("model.attention_implementation", self.attention_implementation,
                         ATTENTION_IMPLEMENTATIONS)
        if self.attention_implementation in FUSED_ATTENTION and self.attention_dropout > 0.0:
            raise UserError(f"model.attention_implementation={self.attention_implementation} "
                            f"computes no attention probabilities to drop: set "
                            f"model.attention_dropout=0 (it is {self.attention_dropout}), or "
                            f"use model.attention_implementation=auto")
        for name in ("dtype", "param_dtype"):
            check_choice(f"model.{name}", getattr(self, name), DTYPES)
        if self.matmul_dtype:
            check_choice("model.matmul_dtype", self.matmul_dtype, DTYPES)
        for name in ("adapter_size", "lora_rank"):
            if getattr(self, name) < 0:
                raise UserError(f"model.{name} must be >= 0, got {getattr(self, name)}")
        if self.lora_rank > self.hidden_size:
            raise UserError(f"LoRA rank {self.lora_rank} is larger than the hidden size "
                            f"{self.hidden_size}")
        if self.lora_rank and not (self.lora_alpha > 0 and 0.0 <= self.lora_dropout < 1.0):
            raise UserError(f"LoRA needs alpha > 0 and dropout in [0, 1), got alpha "
                            f"{self.lora_alpha}, dropout {self.lora_dropout}")
        if not 0 <= self.pad_token_id < self.vocab_size:
            raise UserError(f"model.pad_token_id {self.pad_token_id} is outside the vocabulary")

    def _check_architecture(self) -> None:
        check_choice("model.position_embedding", self.position_embedding, POSITION_EMBEDDINGS)
        check_choice("model.norm", self.norm, NORM_PLACEMENTS)
        check_choice("model.mlp", self.mlp, MLP_KINDS)
        if self.mlp == "geglu" and self.intermediate_size % 2:
            raise UserError(f"model.mlp=geglu splits model.intermediate_size into value and gate "
                            f"halves: {self.intermediate_size} is odd")
        if self.position_embedding == "rope":
            if self.head_dim % 2:
                raise UserError(f"rotary positions rotate pairs of dimensions: the head size "
                                f"{self.head_dim} is odd")
            self._check_theta("model.rope_theta", self.rope_theta, self.max_position_embeddings)
            if self.sliding_window:
                self._check_theta("model.rope_local_theta", self.rope_local_theta,
                                  self.sliding_window)
        if self.positions_from_padding:
            if self.position_embedding != "learned":
                raise UserError("model.positions_from_padding offsets a learned position table; "
                                "rotary positions have none")
            if self.max_sequence_length < 1:
                raise UserError(f"model.positions_from_padding starts positions at "
                                f"pad_token_id + 1 = {self.pad_token_id + 1}: "
                                f"model.max_position_embeddings {self.max_position_embeddings} "
                                "leaves no room for a token")
        check_choice("model.activation", self.activation, ACTIVATIONS)
        if self.embedding_size < 0 or self.embedding_size > self.hidden_size:
            raise UserError(f"model.embedding_size {self.embedding_size} must be in [0, "
                            f"model.hidden_size {self.hidden_size}]: factorised embeddings are "
                            "narrower than the hidden layers (0: none)")
        if self.position_buckets < 0 or self.max_relative_positions < 0:
            raise UserError(f"model.position_buckets and model.max_relative_positions must be "
                            f">= 0, got {self.position_buckets} and "
                            f"{self.max_relative_positions}")
        if self.position_embedding == "relative":
            self._check_relative()
        if self.global_attention_every < 1:
            raise UserError(f"model.global_attention_every must be >= 1, got "
                            f"{self.global_attention_every}")
        if self.sliding_window < 0 or self.sliding_window % 2:
            raise UserError(f"model.sliding_window is a width, even and >= 0 (0: every layer "
                            f"global), got {self.sliding_window}")
        if self.sliding_window >= self.max_position_embeddings:
            raise UserError(f"model.sliding_window {self.sliding_window} is not narrower than "
                            f"the longest sequence (model.max_position_embeddings "
                            f"{self.max_position_embeddings}): make every layer global instead")

    def _check_relative(self) -> None:
        """What DeBERTa's disentangled attention cannot be combined with."""
        # The log buckets divide by log((span - 1) / (buckets // 2)): it must be positive.
        if self.position_buckets and self.relative_span <= self.position_buckets // 2 + 1:
            raise UserError(f"model.max_relative_positions {self.relative_span} must exceed "
                            f"half of model.position_buckets {self.position_buckets}, plus one")
        if self.attention_implementation not in RELATIVE_ATTENTION:
            raise UserError(f"model.position_embedding=relative (DeBERTa) adds position terms "
                            f"that the {self.attention_implementation} kernel cannot: set "
                            f"model.attention_implementation=auto or explicit")
        others = [name for name, value in (
            ("model.sliding_window", self.sliding_window),
            ("model.positions_from_padding", self.positions_from_padding),
            ("model.lora_rank", self.lora_rank), ("model.norm=pre", self.norm == "pre"),
            # ALBERT's options: no DebertaV2 layout holds them
            ("model.embedding_size", self.embedding_size),
            ("model.share_layers", self.share_layers))
            if value]
        if others:
            raise UserError(f"model.position_embedding=relative (DeBERTa) does not combine with "
                            f"{', '.join(others)}")

    @property
    def relative_span(self) -> int:
        """DeBERTa's max_relative_positions, 0 resolved to max_position_embeddings."""
        return self.max_relative_positions or self.max_position_embeddings

    @property
    def relative_table_size(self) -> int:
        """Rows of DeBERTa's relative embedding table: twice the buckets (or the span)."""
        return 2 * (self.position_buckets or self.relative_span)

    @staticmethod
    def _check_theta(name: str, theta: float, length: int) -> None:
        # The slowest rotation's wavelength is 2 pi theta: beyond it positions alias.
        if not theta > 0 or length > 2 * math.pi * theta:
            raise UserError(f"{name}={theta} gives rotary positions a longest wavelength of "
                            f"{2 * math.pi * theta:.0f} tokens, shorter than the {length} they "
                            f"must tell apart: raise it")

    @property
    def has_local_layers(self) -> bool:
        return self.sliding_window > 0 and self.global_attention_every > 1

    def is_global_layer(self, index: int) -> bool:
        return not self.has_local_layers or index % self.global_attention_every == 0

    def record(self) -> dict:
        """The fields as a record: the architecture options only where they differ from BERT's,
        so what BERT-style runs recorded before those options existed stays byte-identical."""
        fields = dataclasses.asdict(self)
        return {k: v for k, v in fields.items()
                if k not in ARCHITECTURE_DEFAULTS or v != ARCHITECTURE_DEFAULTS[k]}

    @property
    def operand_dtype(self) -> str:
        """What the dense layers' matmuls multiply (their results are in `dtype`)."""
        return self.matmul_dtype or self.dtype

    @property
    def max_sequence_length(self) -> int:
        """The longest sequence the position table covers (RoBERTa's offset taken off)."""
        offset = self.pad_token_id + 1 if self.positions_from_padding else 0
        return self.max_position_embeddings - offset

    @property
    def embedding_width(self) -> int:
        """The width of the embedding tables and of what the tied output layer reads."""
        return self.embedding_size or self.hidden_size

    @property
    def head_dim(self) -> int:
        return self.hidden_size // self.num_heads

    @property
    def lora_scale(self) -> float:
        return self.lora_alpha / self.lora_rank if self.lora_rank else 0.0

    def without_adaptation(self) -> "EncoderConfig":
        """The base model: no adapters, no LoRA (what a merged LoRA model or a base is)."""
        return self.replace(adapter_size=0, lora_rank=0)

    def replace(self, **changes) -> "EncoderConfig":
        return dataclasses.replace(self, **changes)


# Every field's default, written once above: the model section's defaults (bertjax/settings/
# shared.py ModelSpec) and the architecture a record leaves out are read from here.
ENCODER_DEFAULTS = {field.name: field.default for field in dataclasses.fields(EncoderConfig)}
ARCHITECTURE_DEFAULTS = {name: ENCODER_DEFAULTS[name] for name in ARCHITECTURE_FIELDS}


PRESETS: dict[str, dict] = {
    "tiny": dict(num_layers=2, hidden_size=128, num_heads=2, intermediate_size=512),
    "mini": dict(num_layers=4, hidden_size=256, num_heads=4, intermediate_size=1024),
    "small": dict(num_layers=4, hidden_size=512, num_heads=8, intermediate_size=2048),
    "medium": dict(num_layers=8, hidden_size=512, num_heads=8, intermediate_size=2048),
    "base": dict(num_layers=12, hidden_size=768, num_heads=12, intermediate_size=3072),
    "large": dict(num_layers=24, hidden_size=1024, num_heads=16, intermediate_size=4096),
    # ModernBERT's sizes (Warner et al., 2024); its architecture is configs/modernbert.py's.
    # The intermediate sizes are GeGLU's up projections, value and gate halves: 2 x 1,152 and
    # 2 x 2,624.
    "modernbert_base": dict(num_layers=22, hidden_size=768, num_heads=12,
                            intermediate_size=2304),
    "modernbert_large": dict(num_layers=28, hidden_size=1024, num_heads=16,
                             intermediate_size=5248),
}


def preset(name: str, **overrides) -> EncoderConfig:
    """A named size with any field overridden; unknown names and fields are user errors."""
    check_choice("model preset", name, PRESETS, unknown=True)
    fields = {f.name for f in dataclasses.fields(EncoderConfig)}
    unknown = sorted(set(overrides) - fields)
    if unknown:
        raise UserError(f"unknown model setting(s): {', '.join(unknown)}")
    return EncoderConfig(**{**PRESETS[name], **overrides})
