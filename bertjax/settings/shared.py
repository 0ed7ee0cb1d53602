"""The parts every job's settings share: the model and the mesh."""

from __future__ import annotations

import dataclasses

import jax

from bertjax.core.errors import UserError
from bertjax.model.config import ARCHITECTURE_DEFAULTS, EncoderConfig, preset
from bertjax.parallel.mesh import first_devices, make_mesh
from bertjax.settings.config_keys import Section, fields_of

# model.preset value that takes the shape and vocabulary from config.init_checkpoint.
FROM_CHECKPOINT = "from_checkpoint"
SIZE_KEYS = ("num_layers", "hidden_size", "num_heads", "intermediate_size")
# Settings that change the layout of a checkpoint; anything else may differ between runs.
LAYOUT_FIELDS = ("vocab_size", "hidden_size", "num_layers", "num_heads", "intermediate_size",
                 "max_position_embeddings", "type_vocab_size", "param_dtype", "scan_layers")
ADAPTATION_LAYOUT_FIELDS = ("adapter_size", "lora_rank")
# Of the architecture options, those that add, drop or reshape parameters; recorded only when
# they differ from BERT's, so BERT-style workdirs compare as before.
ARCHITECTURE_LAYOUT_FIELDS = ("position_embedding", "norm", "mlp", "use_bias", "norm_bias")


@dataclasses.dataclass(frozen=True)
class ModelSpec:
    """The model section: a preset (or the init checkpoint's shape) with this run's numerics."""

    preset: str
    sizes: dict  # SIZE_KEYS given explicitly (0 in the config: the preset's)
    dtype: str
    param_dtype: str
    hidden_dropout: float
    attention_dropout: float
    scan_layers: bool
    remat: str
    max_position_embeddings: int
    type_vocab_size: int
    attention_implementation: str  # "": the backend's choice
    matmul_dtype: str  # "": model.dtype
    layer_norm_eps: float
    architecture: dict  # ARCHITECTURE_DEFAULTS' keys; from_checkpoint takes the checkpoint's

    @property
    def from_checkpoint(self) -> bool:
        return self.preset == FROM_CHECKPOINT

    def _numerics(self) -> dict:
        return dict(dtype=self.dtype, param_dtype=self.param_dtype,
                    hidden_dropout=self.hidden_dropout, attention_dropout=self.attention_dropout,
                    scan_layers=self.scan_layers, remat=self.remat,
                    attention_implementation=self.attention_implementation,
                    matmul_dtype=self.matmul_dtype)

    def encoder(self, vocab_size: int, pad_token_id: int = 0,
                recorded: EncoderConfig | None = None) -> EncoderConfig:
        """The encoder: the preset's (sizes overridden), or with model.preset=from_checkpoint the
        `recorded` shape and vocabulary of the init checkpoint with this config's numerics."""
        if self.from_checkpoint:
            if recorded is None:
                raise UserError(f"model.preset={FROM_CHECKPOINT} takes the model shape from "
                                "config.init_checkpoint, which is not set")
            return self._over(recorded, vocab_size)
        return preset(self.preset, vocab_size=vocab_size, pad_token_id=pad_token_id,
                      max_position_embeddings=self.max_position_embeddings,
                      type_vocab_size=self.type_vocab_size, layer_norm_eps=self.layer_norm_eps,
                      **self.architecture, **self.sizes, **self._numerics())

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
    sizes = {key: int(section[key]) for key in SIZE_KEYS if section[key]}
    spec = ModelSpec(section.preset, sizes, section.dtype, section.param_dtype,
                     section.hidden_dropout, section.attention_dropout, section.scan_layers,
                     section.remat, section.max_position_embeddings, section.type_vocab_size,
                     str(section.attention_implementation), str(section.matmul_dtype),
                     float(section.layer_norm_eps),
                     {key: type(default)(section[key])
                      for key, default in ARCHITECTURE_DEFAULTS.items()})
    _check_attention(spec)
    if not spec.from_checkpoint:
        spec.encoder(vocab_size=1000)  # refuses an unknown preset or a bad shape now, by name
    return spec


@dataclasses.dataclass(frozen=True)
class MeshSettings:
    data: int
    fsdp: int
    tensor: int
    devices: int  # how many of the devices the mesh spans (the first ones); -1: all

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
