"""The BERT encoder in Flax linen: embeddings, post-LN transformer layers, tanh pooler.

Numerics follow Hugging Face's `BertModel` exactly (exact erf GELU, LayerNorm after each residual
add), so converted checkpoints reproduce it to fp32 rounding. Parameters live in
`config.param_dtype` and matmuls run in `config.dtype` (their operands in `config.matmul_dtype`
when set); softmax, LayerNorm and the residual sums that feed LayerNorm run in fp32 whatever the
compute dtype.

Every parameter carries logical axis names (`nn.with_logical_partitioning`) and activations are
constrained at layer boundaries (`nn.with_logical_constraint`); both are inert until the caller
supplies a rules table and a mesh, so the model also runs unsharded.
"""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from bertjax.core.errors import UserError
from bertjax.model import adaptation, low_precision_matmul
from bertjax.model.config import EncoderConfig

Array = jax.Array

# Logical axis names of activations; the sharding rules table maps these to mesh axes.
HIDDEN_AXES = ("batch", "length", "embed")
HEADS_AXES = ("batch", "length", "heads", "kv")
MLP_AXES = ("batch", "length", "mlp")

_REMAT_POLICIES = {
    "full": jax.checkpoint_policies.nothing_saveable,
    "save_dots": jax.checkpoint_policies.dots_with_no_batch_dims_saveable,
}


@flax.struct.dataclass
class EncoderOutput:
    sequence: Array  # [B, L, H] in the compute dtype
    pooled: Array  # [B, H]: tanh(dense(sequence[:, 0]))
    # With Encoder(all_layers=True): [num_layers + 1, B, L, H], the embeddings' output first and
    # `sequence` last (Hugging Face's `hidden_states`, stacked); None otherwise.
    layers: Array | None = None


def kernel_init(config: EncoderConfig, names: tuple) -> Callable:
    """BERT's init, normal(initializer_range), carrying logical axis names."""
    return nn.with_logical_partitioning(nn.initializers.normal(config.initializer_range), names)


def zeros_init(names: tuple) -> Callable:
    return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def layer_norm(config: EncoderConfig, name: str) -> nn.LayerNorm:
    # Two-pass variance (not E[x^2] - E[x]^2) to match torch's LayerNorm to fp32 rounding.
    return nn.LayerNorm(
        epsilon=config.layer_norm_eps, dtype=jnp.float32, param_dtype=config.param_dtype,
        use_fast_variance=False,
        scale_init=nn.with_logical_partitioning(nn.initializers.ones_init(), ("norm",)),
        bias_init=zeros_init(("norm",)), name=name)


def matmul(equation: str, x: Array, kernel: Array, config: EncoderConfig,
           result_dtype: str | None = None) -> Array:
    """einsum of operands in the config's operand dtype into `result_dtype` (the compute dtype).

    `equation` contracts trailing axes of `x` with the leading (or, for a transposed kernel such
    as the tied output layer's, trailing) axes of `kernel`, the free axes in order."""
    operand, result = config.operand_dtype, result_dtype or config.dtype
    if low_precision_matmul.use_fast_gradients(operand):
        return low_precision_matmul.einsum(equation, x, kernel, operand, result)
    return jnp.einsum(equation, x.astype(operand), kernel.astype(operand),
                      preferred_element_type=result)


def _dot_in(operand: str, result: str) -> Callable:
    """A Dense's dot_general whose operands are cast to `operand` and whose result is `result`."""
    def dot_general(lhs, rhs, dimension_numbers, precision=None, preferred_element_type=None):
        if low_precision_matmul.use_fast_gradients(operand):
            return low_precision_matmul.einsum("...k,kn->...n", lhs, rhs, operand, result)
        return jax.lax.dot_general(lhs.astype(operand), rhs.astype(operand), dimension_numbers,
                                   precision=precision, preferred_element_type=result)
    return dot_general


def dense(config: EncoderConfig, features: int, names: tuple, name: str,
          dtype: str | None = None) -> nn.Dense:
    """A Dense whose kernel is named `names` and whose bias takes the output axis name."""
    # A head that asks for its own dtype (fp32 scores) keeps operands of that dtype too.
    extra = {}
    if dtype is None and (config.operand_dtype != config.dtype
                          or low_precision_matmul.use_fast_gradients(config.operand_dtype)):
        extra["dot_general"] = _dot_in(config.operand_dtype, config.dtype)
    dtype = dtype or config.dtype
    return nn.Dense(
        features, dtype=dtype, param_dtype=config.param_dtype,
        kernel_init=kernel_init(config, names), bias_init=zeros_init(names[-1:]), name=name,
        **extra)


def gelu(x: Array) -> Array:
    return jax.nn.gelu(x, approximate=False)


def gather_positions(sequence: Array, positions: Array) -> Array:
    """sequence [B, L, H] at positions [B, P] -> [B, P, H]."""
    return jnp.take_along_axis(sequence, positions[..., None].astype(jnp.int32), axis=1)


def attention(query: Array, key: Array, value: Array, mask: Array, *, dropout_rate: float = 0.0,
              dropout_rng: Array | None = None, implementation: str = "") -> Array:
    """Bidirectional attention over [B, T, N, D] inputs; `mask` is bool [B, 1, 1, S].

    Without dropout this is `jax.nn.dot_product_attention`, which the backend may fuse
    (`implementation`: "" the backend's choice, "xla", "cudnn"). cuDNN's fused kernel takes
    padding as key lengths rather than a mask: BERT's padding is a suffix, so the lengths are the
    mask's counts. BERT's dropout on the attention probabilities needs the probabilities
    themselves, so then the same computation is spelled out (fp32 logits and softmax, as the
    fused path does).
    """
    if dropout_rate == 0.0 or dropout_rng is None:
        if implementation == "cudnn":
            lengths = jnp.sum(mask[:, 0, 0, :], axis=-1, dtype=jnp.int32)
            return jax.nn.dot_product_attention(query, key, value,
                                                key_value_seq_lengths=lengths,
                                                implementation="cudnn")
        return jax.nn.dot_product_attention(query, key, value, mask=mask,
                                            implementation=implementation or None)
    return explicit_attention(query, key, value, mask, dropout_rate=dropout_rate,
                              dropout_rng=dropout_rng)


def explicit_attention(query: Array, key: Array, value: Array, mask: Array, *,
                       dropout_rate: float = 0.0, dropout_rng: Array | None = None) -> Array:
    scale = 1.0 / jnp.sqrt(jnp.float32(query.shape[-1]))
    logits = jnp.einsum("btnd,bsnd->bnts", query, key, preferred_element_type=jnp.float32)
    logits = logits * scale
    # The fused path's fill value: finite, so a fully masked row cannot produce NaNs.
    logits = jnp.where(mask, logits, jnp.float32(-0.7) * jnp.finfo(jnp.float32).max)
    probs = jax.nn.softmax(logits, axis=-1)
    if dropout_rate > 0.0 and dropout_rng is not None:
        keep = jax.random.bernoulli(dropout_rng, 1.0 - dropout_rate, probs.shape)
        probs = jnp.where(keep, probs / (1.0 - dropout_rate), 0.0)
    return jnp.einsum("bnts,bsnd->btnd", probs.astype(value.dtype), value)


class Embeddings(nn.Module):
    """Word + absolute position + segment embeddings, then LayerNorm and dropout."""

    config: EncoderConfig

    def setup(self):
        cfg = self.config

        def table(name: str, rows: int, names: tuple) -> Array:
            return self.param(name, kernel_init(cfg, names), (rows, cfg.hidden_size),
                              cfg.param_dtype)

        self.word_embeddings = table("word_embeddings", cfg.vocab_size, ("vocab", "embed"))
        self.position_embeddings = table(
            "position_embeddings", cfg.max_position_embeddings, (None, "embed"))
        self.token_type_embeddings = table(
            "token_type_embeddings", cfg.type_vocab_size, (None, "embed"))
        self.layer_norm = layer_norm(cfg, "layer_norm")
        self.dropout = nn.Dropout(cfg.hidden_dropout)

    def __call__(self, input_ids: Array, segment_ids: Array, deterministic: bool,
                 prompt: Array | None = None) -> Array:
        """`prompt` [N, H]: soft-prompt vectors that take the word embeddings' place at positions
        1..N (slots the featurization reserved after [CLS]); position and segment embeddings are
        added to them as to any token."""
        length = input_ids.shape[1]
        if length > self.config.max_position_embeddings:
            raise UserError(f"sequence length {length} exceeds model.max_position_embeddings "
                            f"{self.config.max_position_embeddings}")
        f32 = jnp.float32
        # Gather the fsdp-sharded hidden dimension before the lookups (as FSDP does for every
        # weight); a gather from a table sharded on its columns makes XLA rematerialize it whole.
        words = nn.with_logical_constraint(self.word_embeddings, ("vocab", None))
        types = nn.with_logical_constraint(self.token_type_embeddings, (None, None))
        positions = nn.with_logical_constraint(self.position_embeddings, (None, None))
        # Summed in fp32 and in Hugging Face's order, (word + type) + position.
        word = jnp.take(words, input_ids, axis=0).astype(f32)
        if prompt is not None:
            n = prompt.shape[0]
            if n + 2 > length:
                raise UserError(f"a soft prompt of {n} vectors needs more than {length} positions")
            vectors = jnp.broadcast_to(prompt.astype(f32)[None], (word.shape[0], *prompt.shape))
            word = jnp.concatenate([word[:, :1], vectors, word[:, 1 + n:]], axis=1)
        x = word + jnp.take(types, segment_ids, axis=0).astype(f32)
        x = x + positions[None, :length].astype(f32)
        x = self.dropout(self.layer_norm(x), deterministic=deterministic)
        return nn.with_logical_constraint(x.astype(self.config.dtype), HIDDEN_AXES)

    def attend(self, x: Array) -> Array:
        """x [..., H] -> fp32 scores [..., V] against the word embeddings (tied output layer)."""
        return matmul("...h,vh->...v", x, self.word_embeddings, self.config, "float32")


class EinsumDense(nn.Module):
    """`einsum(equation, x, kernel) + bias` in the compute dtype; the bias spans the kernel's
    last `out_dims` axes. (Flax's DenseGeneral initialises a flattened kernel and reshapes it,
    which breaks its own logical sharding constraint once axis rules are active.)"""

    config: EncoderConfig
    equation: str
    kernel_shape: tuple[int, ...]
    kernel_axes: tuple[str | None, ...]
    out_dims: int = 1

    @nn.compact
    def __call__(self, x: Array) -> Array:
        cfg = self.config
        kernel = self.param("kernel", kernel_init(cfg, self.kernel_axes), self.kernel_shape,
                            cfg.param_dtype)
        bias = self.param("bias", zeros_init(self.kernel_axes[-self.out_dims:]),
                          self.kernel_shape[-self.out_dims:], cfg.param_dtype)
        return matmul(self.equation, x, kernel, cfg) + bias.astype(cfg.dtype)


class SelfAttention(nn.Module):
    config: EncoderConfig

    @nn.compact
    def __call__(self, x: Array, mask: Array, deterministic: bool) -> Array:
        cfg = self.config
        heads = (cfg.num_heads, cfg.head_dim)

        def project(name: str) -> Array:
            y = EinsumDense(cfg, "blh,hnd->blnd", (cfg.hidden_size, *heads),
                            ("embed", "heads", "kv"), out_dims=2, name=name)(x)
            if cfg.lora_rank and name in adaptation.LORA_TARGETS:
                y = y + adaptation.LowRankUpdate(cfg, name=name + adaptation.LORA_SUFFIX)(
                    x, deterministic)
            return nn.with_logical_constraint(y, HEADS_AXES)

        query, key, value = project("query"), project("key"), project("value")
        dropout_rng = None
        if not deterministic and cfg.attention_dropout > 0.0:
            dropout_rng = self.make_rng("dropout")
        context = attention(query, key, value, mask, dropout_rate=cfg.attention_dropout,
                            dropout_rng=dropout_rng,
                            implementation=cfg.attention_implementation)
        context = nn.with_logical_constraint(context, HEADS_AXES)
        return EinsumDense(cfg, "blnd,ndh->blh", (*heads, cfg.hidden_size),
                           ("heads", "kv", "embed"), name="output")(context)


class TransformerLayer(nn.Module):
    """One post-LN BERT layer. Returns (hidden, None) so `nn.scan` can use it as its body, or
    (hidden, hidden) with `emit`, which makes scan stack every layer's output."""

    config: EncoderConfig
    emit: bool = False

    @nn.compact
    def __call__(self, x: Array, mask: Array, deterministic: bool) -> tuple[Array, None]:
        cfg = self.config
        f32 = jnp.float32
        attended = SelfAttention(cfg, name="attention")(x, mask, deterministic)
        attended = nn.Dropout(cfg.hidden_dropout)(attended, deterministic=deterministic)
        if cfg.adapter_size:
            attended = adaptation.Adapter(cfg, name="attention" + adaptation.ADAPTER_SUFFIX)(
                attended)
        x = layer_norm(cfg, "attention_norm")(x.astype(f32) + attended.astype(f32))
        x = nn.with_logical_constraint(x.astype(cfg.dtype), HIDDEN_AXES)

        h = dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "intermediate")(x)
        h = gelu(nn.with_logical_constraint(h, MLP_AXES))
        h = dense(cfg, cfg.hidden_size, ("mlp", "embed"), "output")(h)
        h = nn.Dropout(cfg.hidden_dropout)(h, deterministic=deterministic)
        if cfg.adapter_size:
            h = adaptation.Adapter(cfg, name="output" + adaptation.ADAPTER_SUFFIX)(h)
        x = layer_norm(cfg, "output_norm")(x.astype(f32) + h.astype(f32))
        x = nn.with_logical_constraint(x.astype(cfg.dtype), HIDDEN_AXES)
        return x, (x if self.emit else None)


def layer_class(config: EncoderConfig) -> type[nn.Module]:
    """TransformerLayer wrapped in remat and/or scan as the config asks."""
    cls = TransformerLayer
    if config.remat != "none":
        # `deterministic` (argument 3, counting self) is a Python bool: keep it static.
        # Inside scan, CSE across iterations is impossible anyway, so skip its prevention.
        cls = nn.remat(cls, policy=_REMAT_POLICIES[config.remat], static_argnums=(3,),
                       prevent_cse=not config.scan_layers)
    if config.scan_layers:
        cls = nn.scan(
            cls, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
            in_axes=(nn.broadcast, nn.broadcast), length=config.num_layers,
            metadata_params={nn.PARTITION_NAME: "layers"})
    return cls


class Encoder(nn.Module):
    """BERT's encoder (Hugging Face `BertModel`), usable alone or inside task heads.

    Parameters: `embeddings`, then `layers` (scan: stacked on a leading "layers" axis) or
    `layer_0` .. `layer_{L-1}` (loop), then `pooler`. `all_layers` changes no parameter, only
    what is returned (EncoderOutput.layers); training leaves it off, so nothing extra is kept.
    """

    config: EncoderConfig
    all_layers: bool = False

    def setup(self):
        cfg = self.config
        self.embeddings = Embeddings(cfg)
        cls = layer_class(cfg)
        if cfg.scan_layers:
            self.layers = cls(cfg, emit=self.all_layers)
        else:
            for i in range(cfg.num_layers):
                setattr(self, f"layer_{i}", cls(cfg, emit=self.all_layers))
        self.pooler = dense(cfg, cfg.hidden_size, ("embed", None), "pooler")

    def __call__(self, input_ids: Array, segment_ids: Array, input_mask: Array, *,
                 deterministic: bool = True, prompt: Array | None = None) -> EncoderOutput:
        """`prompt`: soft-prompt vectors for the embeddings (see Embeddings)."""
        x = self.embeddings(input_ids, segment_ids, deterministic, prompt)
        mask = input_mask.astype(bool)[:, None, None, :]
        embedded = x
        if self.config.scan_layers:
            x, stacked = self.layers(x, mask, deterministic)
        else:
            outputs = []
            for i in range(self.config.num_layers):
                x, emitted = getattr(self, f"layer_{i}")(x, mask, deterministic)
                outputs.append(emitted)
            stacked = jnp.stack(outputs) if self.all_layers else None
        pooled = jnp.tanh(self.pooler(x[:, 0]))
        layers = jnp.concatenate([embedded[None], stacked]) if self.all_layers else None
        return EncoderOutput(sequence=x, pooled=pooled, layers=layers)

    def attend(self, x: Array) -> Array:
        """The output projection tied to the word embeddings: x [..., H] -> fp32 [..., V]."""
        return self.embeddings.attend(x)
