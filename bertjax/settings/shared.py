"""The parts every job's settings share: the model and the mesh."""

from __future__ import annotations

import dataclasses

import jax

from bertjax.core.errors import UserError, check_int
from bertjax.model.config import ARCHITECTURE_FIELDS, ENCODER_DEFAULTS, EncoderConfig, preset
from bertjax.parallel.mesh import first_devices, make_mesh
from bertjax.settings.config_keys import Section, fields_of
from bertjax.settings.defaults import defaults

# model.preset value that takes the shape and vocabulary from config.init_checkpoint.
FROM_CHECKPOINT = "from_checkpoint"
SIZE_KEYS = ("num_layers", "hidden_size", "num_heads", "intermediate_size")
# What a from_checkpoint run applies over the checkpoint's recorded encoder (the rest is its shape
# and architecture).
NUMERIC_KEYS = ("dtype", "param_dtype", "hidden_dropout", "attention_dropout", "scan_layers",
                "remat", "attention_implementation", "matmul_dtype")
# Settings that change the layout of a checkpoint; anything else may differ between runs.
LAYOUT_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                 "max_position_embeddings", "type_vocab_size", "param_dtype", "scan_layers")
ADAPTATION_LAYOUT_FIELDS = ("adapter_size", "lora_rank")
# Of the architecture options, those that add, drop or reshape parameters; recorded only when
# they differ from BERT's, so BERT-style workdirs compare as before.
ARCHITECTURE_LAYOUT_FIELDS = ("position_embedding", "norm", "mlp", "use_bias", "norm_bias",
                              "embedding_size", "share_layers", "position_buckets",
                              "max_relative_positions")


def _encoder(name: str):
    """The default of EncoderConfig's field `name`, where it is written and checked."""
    return ENCODER_DEFAULTS[name]


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelSpec:
    """The model section, each key with its default: a preset (or the init checkpoint's shape)
    with this run's numerics and architecture. A key that is an EncoderConfig field takes its
    default and its check from there (bertjax/model/config.py)."""

    # tiny | mini | small | medium | base | large | modernbert_base | modernbert_large, or
    # from_checkpoint: the shape and vocabulary of config.init_checkpoint (a pretraining workdir,
    # a params export or a `python -m bertjax.convert --from-hf` output).
    preset: str = "base"
    # 0 keeps the preset's size; set any of these to change one dimension of it.
    num_layers: int = 0
    hidden_size: int = 0
    num_heads: int = 0
    intermediate_size: int = 0
    dtype: str = _encoder("dtype")  # compute dtype; "bfloat16" on accelerators
    param_dtype: str = _encoder("param_dtype")
    # Fine-tuning: hidden_dropout is also the dropout before the classifier.
    hidden_dropout: float = _encoder("hidden_dropout")
    attention_dropout: float = _encoder("attention_dropout")
    # auto (by the platform compiled for: TPU splash, GPU cuDNN where it applies, CPU XLA) |
    # xla | cudnn (GPU, bf16) | splash | explicit (bertjax/model/attention_choice.py)
    attention_implementation: str = _encoder("attention_implementation")
    # "bfloat16" with dtype float32: bf16 matmul operands, fp32 results and everything else
    # (docs/speed.md: faster on a CPU with AVX512-BF16). "": model.dtype.
    matmul_dtype: str = _encoder("matmul_dtype")
    # A run scans its layers (one compiled layer body: faster compiles); a bare EncoderConfig,
    # which also reads records and Hugging Face configs, unrolls them.
    scan_layers: bool = True
    remat: str = _encoder("remat")  # none | full | save_dots
    max_position_embeddings: int = _encoder("max_position_embeddings")
    # 0: no segment embeddings (ModernBERT, RoBERTa-like)
    type_vocab_size: int = _encoder("type_vocab_size")
    layer_norm_eps: float = _encoder("layer_norm_eps")
    # The architecture: BERT's by default; configs/modernbert.py sets ModernBERT's (rope, pre,
    # geglu, no biases, sliding windows). With preset from_checkpoint the checkpoint's are used.
    position_embedding: str = _encoder("position_embedding")  # learned | rope | relative
    rope_theta: float = _encoder("rope_theta")  # rope: the global layers' base
    rope_local_theta: float = _encoder("rope_local_theta")  # rope: the sliding-window layers'
    norm: str = _encoder("norm")  # post (BERT) | pre (norm before each sublayer)
    mlp: str = _encoder("mlp")  # gelu | geglu (intermediate_size: both halves)
    use_bias: bool = _encoder("use_bias")  # biases in the dense layers
    norm_bias: bool = _encoder("norm_bias")  # biases in the LayerNorms
    global_attention_every: int = _encoder("global_attention_every")  # from layer 0
    sliding_window: int = _encoder("sliding_window")  # the other layers' width (0: all global)
    # RoBERTa's positions: from pad_token_id + 1 over the non-padding tokens (model/config.py)
    positions_from_padding: bool = _encoder("positions_from_padding")
    # ALBERT (configs/albert.py): embedding tables this wide, projected to hidden_size (0: none;
    # at most hidden_size), one layer's parameters for every layer, and gelu | gelu_tanh.
    embedding_size: int = _encoder("embedding_size")
    share_layers: bool = _encoder("share_layers")
    activation: str = _encoder("activation")
    # relative (DeBERTa): distances in log buckets beyond position_buckets // 2, up to
    # max_relative_positions (0: max_position_embeddings); position_buckets 0: no buckets
    position_buckets: int = _encoder("position_buckets")
    max_relative_positions: int = _encoder("max_relative_positions")
    # Pretraining with relative positions and a masked LM only: DeBERTa's enhanced mask
    # decoder, this many passes of the last layer (the paper's 2) with absolute positions
    # before the MLM head (model/enhanced_mask_decoder.py); 0: none.
    enhanced_mask_decoder: int = 0

    @property
    def from_checkpoint(self) -> bool:
        return self.preset == FROM_CHECKPOINT

    @property
    def sizes(self) -> dict:
        """The SIZE_KEYS given explicitly (0 in the config: the preset's)."""
        return {key: getattr(self, key) for key in SIZE_KEYS if getattr(self, key)}

    @property
    def architecture(self) -> dict:
        """The ARCHITECTURE_FIELDS; from_checkpoint takes the checkpoint's instead."""
        return {key: getattr(self, key) for key in ARCHITECTURE_FIELDS}

    def _numerics(self) -> dict:
        return {key: getattr(self, key) for key in NUMERIC_KEYS}

    def encoder(self, vocab_size: int, pad_token_id: int = 0,
                recorded: EncoderConfig | None = None) -> EncoderConfig:
        """The encoder: the preset's (sizes overridden), or with model.preset=from_checkpoint the
        `recorded` shape and vocabulary of the init checkpoint with this config's numerics."""
        if self.from_checkpoint:
            if recorded is None:
                raise UserError(f"model.preset={FROM_CHECKPOINT} takes the model shape from "
                                "config.init_checkpoint, which is not set")
            return self._over(recorded, vocab_size)
        fields = {field.name: getattr(self, field.name) for field in dataclasses.fields(self)
                  if field.name not in ("preset", "enhanced_mask_decoder", *SIZE_KEYS)}
        return preset(self.preset, vocab_size=vocab_size, pad_token_id=pad_token_id,
                      **fields, **self.sizes)

    def _over(self, recorded: EncoderConfig, vocab_size: int | None) -> EncoderConfig:
        for key, value in self.sizes.items():
            if value != getattr(recorded, key):
                raise UserError(f"model.{key}={value} disagrees with the init checkpoint's "
                                f"{getattr(recorded, key)}; leave it 0 with {FROM_CHECKPOINT}")
        if vocab_size is not None and vocab_size > recorded.vocab_size:
            raise UserError(f"the tokenizer has {vocab_size} tokens, the init checkpoint embeds "
                            f"{recorded.vocab_size}: use the checkpoint's own vocabulary")
        return recorded.replace(**self._numerics())


def layout_of(encoder: EncoderConfig) -> dict:
    """What of an encoder a workdir's checkpoints depend on (compared on resume). Adapters and
    LoRA count only when present, so the records of runs without them stay as they were."""
    fields = encoder.record()
    return {k: v for k, v in fields.items()
            if k in LAYOUT_FIELDS or k in ARCHITECTURE_LAYOUT_FIELDS
            or (k in ADAPTATION_LAYOUT_FIELDS and v)}


def model_spec(section: Section) -> ModelSpec:
    values = fields_of(ModelSpec, section, "model")
    # A number given where the default is a float (or a size, an int) takes the default's type.
    spec = ModelSpec(**{key: type(default)(values[key]) if type(default) in (int, float, str)
                        else values[key] for key, default in defaults(ModelSpec).items()})
    _check_attention(spec)
    _check_mask_decoder(spec)
    for key in ("rope_theta", "rope_local_theta"):  # used with rope only, checked always
        if not getattr(spec, key) > 0:
            raise UserError(f"model.{key} must be positive, got {getattr(spec, key)}")
    if not spec.from_checkpoint:
        spec.encoder(vocab_size=1000)  # refuses an unknown preset or a bad shape now, by name
    else:  # the checkpoint gives the shape: the section's other values, checked on base's
        base = {**dataclasses.asdict(spec), "preset": "base", **dict.fromkeys(SIZE_KEYS, 0)}
        ModelSpec(**base).encoder(vocab_size=1000)
    return spec


@dataclasses.dataclass(frozen=True)
class MeshSettings:
    """The mesh section: sizes of the (data, fsdp, tensor) axes; one may be -1 (all remaining
    devices)."""

    data: int = -1
    fsdp: int = 1
    tensor: int = 1
    # The devices the axes span: the first N of this machine's (one process only), e.g. to leave
    # the others to another job; -1: every device of every process.
    devices: int = -1

    def make(self, devices=None):
        """The mesh over the first `self.devices` of `devices` (default: JAX's, every host's)."""
        return make_mesh(data=self.data, fsdp=self.fsdp, tensor=self.tensor,
                         devices=first_devices(self.devices, devices))


def mesh_settings(section: Section) -> MeshSettings:
    mesh = MeshSettings(**fields_of(MeshSettings, section, "mesh"))
    if type(mesh.devices) is not int or not (mesh.devices == -1 or mesh.devices >= 1):
        raise UserError(f"mesh.devices must be a positive number of devices or -1 (all), got "
                        f"{mesh.devices!r}")
    return mesh


def _check_mask_decoder(spec: ModelSpec) -> None:
    """The decoder's passes reuse the last layer's disentangled attention."""
    check_int("model.enhanced_mask_decoder", spec.enhanced_mask_decoder, 0, "(0: none)")
    relative = spec.from_checkpoint or spec.position_embedding == "relative"
    if spec.enhanced_mask_decoder and not relative:
        raise UserError(f"model.enhanced_mask_decoder={spec.enhanced_mask_decoder} is DeBERTa's: "
                        f"it needs model.position_embedding=relative, got "
                        f"{spec.position_embedding!r} (configs/deberta.py)")


def _check_attention(spec: ModelSpec) -> None:
    """cuDNN's fused attention exists only on a GPU, and only for 16-bit inputs."""
    if spec.attention_implementation != "cudnn":
        return
    if jax.default_backend() != "gpu":
        raise UserError("model.attention_implementation=cudnn needs a GPU (this backend is "
                        f"{jax.default_backend()}); leave it empty to let the backend choose")
    if spec.dtype not in ("bfloat16", "float16"):
        raise UserError("model.attention_implementation=cudnn runs in bfloat16 or float16; set "
                        f"model.dtype=bfloat16 (it is {spec.dtype})")
