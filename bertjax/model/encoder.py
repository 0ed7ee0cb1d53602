"""The encoder in Flax linen: embeddings, transformer layers, tanh pooler.

With the config's defaults this is Hugging Face's `BertModel` exactly (exact erf GELU, LayerNorm
after each residual add); with ModernBERT's options (rotary positions, pre-norm, GeGLU, no
biases, sliding-window layers) it is `ModernBertModel`, with ALBERT's (factorised
embeddings, one layer's parameters shared by every layer, tanh GELU) `AlbertModel`, and with
relative positions (DeBERTa's disentangled attention, model/disentangled_attention.py)
`DebertaV2Model`. Converted checkpoints reproduce each to fp32 rounding. Parameters live in
`config.param_dtype` and matmuls run in `config.dtype` (their operands in `config.matmul_dtype`
when set); softmax, LayerNorm and the residual sums that feed LayerNorm run in fp32 whatever the
compute dtype.

Every parameter carries logical axis names (`nn.with_logical_partitioning`) and activations are
constrained at layer boundaries (`nn.with_logical_constraint`); both are inert until the caller
supplies a rules table and a mesh, so the model also runs unsharded.
"""

from __future__ import annotations

import flax.linen as nn
import flax.struct
import jax
import jax.numpy as jnp

from bertjax.model import adaptation, disentangled_attention
from bertjax.model.attention import AttentionContext, attend, context, heads_major
from bertjax.model.config import EncoderConfig
from bertjax.model.embeddings import HIDDEN_AXES, Embeddings
from bertjax.model.primitives import (EinsumDense, activate, dense, gather_positions,
                                      layer_norm)

Array = jax.Array

# Logical axis names of activations; the sharding rules table maps these to mesh axes.
HEADS_AXES = ("batch", "length", "heads", "kv")
HEADS_MAJOR_AXES = ("batch", "heads", "length", "kv")
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
    # With Encoder(keep_last_input=True): [B, L, H], the last layer's input; None otherwise.
    last_input: Array | None = None


class SelfAttention(nn.Module):
    config: EncoderConfig

    @nn.compact
    def __call__(self, x: Array, ctx: AttentionContext, is_global,
                 deterministic: bool, queries: Array | None = None) -> Array:
        """`queries` [B, P, H] (the enhanced mask decoder's): the queries' source, x the keys'
        and values'; else x is all three."""
        cfg = self.config
        heads = (cfg.num_heads, cfg.head_dim)

        projections = {name: EinsumDense(cfg, "blh,hnd->blnd", (cfg.hidden_size, *heads),
                                         ("embed", "heads", "kv"), out_dims=2,
                                         use_bias=cfg.use_bias, name=name)
                       for name in ("query", "key", "value")}

        def project(name: str, source: Array) -> Array:
            y = projections[name](source)
            if cfg.lora_rank and name in adaptation.LORA_TARGETS:
                y = y + adaptation.LowRankUpdate(cfg, name=name + adaptation.LORA_SUFFIX)(
                    source, deterministic)
            return nn.with_logical_constraint(y, HEADS_AXES)

        query = project("query", x if queries is None else queries)
        key, value = project("key", x), project("value", x)
        dropout_rng = None
        if not deterministic and cfg.attention_dropout > 0.0:
            dropout_rng = self.make_rng("dropout")
        if ctx.relative is None:
            context = attend(query, key, value, ctx, cfg, is_global, dropout_rng)
        else:  # DeBERTa: the layer's query and key projections of the shared relative table
            table = nn.Dropout(cfg.hidden_dropout)(ctx.relative, deterministic=deterministic)
            pos_query, pos_key = (projections[name](table[None])[0] for name in ("query", "key"))
            context = disentangled_attention.attention(query, key, value, pos_query, pos_key,
                                                       ctx.full_mask(), cfg, dropout_rng,
                                                       ctx.query_positions)
        # The splash kernel's [B, N, L, D] is contracted as it is (attention.heads_major).
        major = heads_major(cfg, ctx, dropout_rng)
        context = nn.with_logical_constraint(context, HEADS_MAJOR_AXES if major else HEADS_AXES)
        return EinsumDense(cfg, "bnld,ndh->blh" if major else "blnd,ndh->blh",
                           (*heads, cfg.hidden_size),
                           ("heads", "kv", "embed"), use_bias=cfg.use_bias, name="output")(context)


def feed_forward(config: EncoderConfig, x: Array) -> Array:
    """dense + GELU + dense, or GeGLU: GELU(first half) x second half of one up projection
    (Hugging Face ModernBert's `Wi(x).chunk(2)`), then the down projection. Called inside a
    layer's compact method, so `intermediate` and `output` are the layer's own children."""
    cfg = config
    h = dense(cfg, cfg.intermediate_size, ("embed", "mlp"), "intermediate",
              use_bias=cfg.use_bias)(x)
    h = nn.with_logical_constraint(h, MLP_AXES)
    if cfg.mlp == "geglu":
        value, gate = jnp.split(h, 2, axis=-1)
        h = activate(cfg, value) * gate
    else:
        h = activate(cfg, h)
    return dense(cfg, cfg.hidden_size, ("mlp", "embed"), "output", use_bias=cfg.use_bias)(h)


class TransformerLayer(nn.Module):
    """One layer, post-LN (BERT) or pre-LN (ModernBERT: no norm before layer 0's attention,
    whose input the embeddings' norm has just normalised). Returns (hidden, None) so `nn.scan`
    can use it as its body, or (hidden, hidden) with `emit`, which makes scan stack every
    layer's output. `index` is the layer's number: a Python int in a loop, traced under scan.
    `query_states` [B, P, H] (post-LN only; the enhanced mask decoder's, at
    ctx.query_positions): the attention's queries and the residual are those rows, its keys and
    values x, and the output is [B, P, H]. With `carry_input` x is the pair (hidden, any) and
    the layer returns ((output, hidden), None): a scan's carry then ends holding the last layer's
    input, one [B, L, H] array rather than every layer's output."""

    config: EncoderConfig
    emit: bool = False
    carry_input: bool = False

    @nn.compact
    def __call__(self, x: Array, ctx: AttentionContext, index, deterministic: bool,
                 query_states: Array | None = None) -> tuple[Array, Array | None]:
        cfg = self.config
        if self.carry_input:
            x, _ = x
            layer_input = x
        pre = cfg.norm == "pre"
        if pre and query_states is not None:
            raise ValueError("query_states take a post-LN layer (DeBERTa's)")
        is_global = (index % cfg.global_attention_every == 0 if isinstance(index, int)
                     else jnp.equal(index % cfg.global_attention_every, 0))
        attention_norm = layer_norm(cfg, "attention_norm")
        attention_input = x
        if pre:  # layer 0 still owns the norm, so that every layer has the same parameters
            normed = attention_norm(x).astype(cfg.dtype)
            first = index == 0 if isinstance(index, int) else jnp.equal(index, 0)
            attention_input = jnp.where(first, x, normed)
        attended = SelfAttention(cfg, name="attention")(attention_input, ctx, is_global,
                                                        deterministic, query_states)
        residual = x if query_states is None else query_states
        x = self._residual(residual, attended, "attention", None if pre else attention_norm,
                           deterministic)
        output_norm = layer_norm(cfg, "output_norm")
        h = feed_forward(cfg, output_norm(x).astype(cfg.dtype) if pre else x)
        x = self._residual(x, h, "output", None if pre else output_norm, deterministic)
        if self.carry_input:
            return (x, layer_input), None
        return x, (x if self.emit else None)

    def _residual(self, x: Array, update: Array, name: str, norm: nn.Module | None,
                  deterministic: bool) -> Array:
        """x + dropout(update) (through an adapter if any) in fp32, normed after when post-LN."""
        cfg = self.config
        update = nn.Dropout(cfg.hidden_dropout)(update, deterministic=deterministic)
        if cfg.adapter_size:
            update = adaptation.Adapter(cfg, name=name + adaptation.ADAPTER_SUFFIX)(update)
        x = x.astype(jnp.float32) + update.astype(jnp.float32)
        if norm is not None:
            x = norm(x)
        return nn.with_logical_constraint(x.astype(cfg.dtype), HIDDEN_AXES)


def layer_class(config: EncoderConfig) -> type[nn.Module]:
    """TransformerLayer wrapped in remat and/or scan as the config asks."""
    cls = TransformerLayer
    if config.remat != "none":
        # `deterministic` (argument 4, counting self) is a Python bool and, in a loop, so is the
        # layer's index: keep them static. Inside scan, CSE across iterations is impossible
        # anyway, so skip its prevention.
        cls = nn.remat(cls, policy=_REMAT_POLICIES[config.remat],
                       static_argnums=(4,) if config.scan_layers else (3, 4),
                       prevent_cse=not config.scan_layers)
    if config.scan_layers and config.share_layers:
        # ALBERT: one layer's parameters, broadcast to (not stacked over) every iteration.
        cls = nn.scan(
            cls, variable_broadcast="params", split_rngs={"params": False, "dropout": True},
            in_axes=(nn.broadcast, 0, nn.broadcast), length=config.num_layers)
    elif config.scan_layers:
        cls = nn.scan(
            cls, variable_axes={"params": 0}, split_rngs={"params": True, "dropout": True},
            in_axes=(nn.broadcast, 0, nn.broadcast), length=config.num_layers,
            metadata_params={nn.PARTITION_NAME: "layers"})
    return cls


def make_layers(config: EncoderConfig, emit: bool = False, named: bool = False,
                carry_input: bool = False) -> dict:
    """The layers' modules by name: {"layers": scanned} or {"layer_0": .., "layer_{L-1}": ..},
    or {"shared_layer": one} (model.share_layers, looped or scanned over without stacking).
    `named` names them (a compact module's children); setup() names them by attribute."""
    cls = layer_class(config)
    return {name: cls(config, emit=emit, carry_input=carry_input,
                      **({"name": name} if named else {}))
            for name in layer_names(config)}


SHARED_LAYER = "shared_layer"  # model.share_layers: the one layer, scanned or looped over


def layer_names(config: EncoderConfig) -> list[str]:
    if config.share_layers:
        return [SHARED_LAYER]
    return ["layers"] if config.scan_layers else [f"layer_{i}" for i in range(config.num_layers)]


def run_layers(config: EncoderConfig, layers: dict, x: Array, ctx: AttentionContext,
               deterministic: bool, emit: bool = False) -> tuple[Array, Array | None]:
    """x through the layers of make_layers(): (last hidden, [L, B, T, H] every layer's output
    when `emit`, else None)."""
    if config.scan_layers:
        (scanned,) = layers.values()
        return scanned(x, ctx, jnp.arange(config.num_layers), deterministic)
    outputs = []
    modules = list(layers.values()) * (config.num_layers if config.share_layers else 1)
    for i, layer in enumerate(modules):
        x, emitted = layer(x, ctx, i, deterministic)
        outputs.append(emitted)
    return x, (jnp.stack(outputs) if emit else None)


class Encoder(nn.Module):
    """The encoder (Hugging Face `BertModel`, or `ModernBertModel` with its options), usable
    alone or inside task heads.

    Parameters: `embeddings`, then `layers` (scan: stacked on a leading "layers" axis) or
    `layer_0` .. `layer_{L-1}` (loop) or, with model.share_layers (ALBERT), `shared_layer`, then
    `final_norm` (pre-LN only), `relative_embeddings` (DeBERTa only) and `pooler`.
    `all_layers` changes no parameter, only what is returned (EncoderOutput.layers); training
    leaves it off, so nothing extra is kept. `keep_last_input` (the enhanced mask decoder's)
    returns the last layer's input too (EncoderOutput.last_input), carried through the layers.
    """

    config: EncoderConfig
    all_layers: bool = False
    keep_last_input: bool = False

    def setup(self):
        cfg = self.config
        self.embeddings = Embeddings(cfg)
        for name, layer in make_layers(cfg, emit=self.all_layers,
                                       carry_input=self.keep_last_input).items():
            setattr(self, name, layer)
        if cfg.norm == "pre":
            self.final_norm = layer_norm(cfg, "final_norm")
        if cfg.position_embedding == "relative":
            self.relative_embeddings = disentangled_attention.RelativeEmbeddings(cfg)
        self.pooler = dense(cfg, cfg.hidden_size, ("embed", None), "pooler",
                            use_bias=cfg.use_bias)

    def __call__(self, input_ids: Array, segment_ids: Array, input_mask: Array, *,
                 deterministic: bool = True, prompt: Array | None = None,
                 positions: Array | None = None, pack_ids: Array | None = None,
                 pool_positions: Array | None = None,
                 word_delta: Array | None = None) -> EncoderOutput:
        """`prompt`: soft-prompt vectors for the embeddings (see Embeddings). Packed rows give
        `positions` [B, L] (restarting at each sequence), `pack_ids` [B, L] (a token attends
        only to tokens of its own sequence) and `pool_positions` [B, S] (each sequence's [CLS]:
        `pooled` is then [B, S, H]). `word_delta`: GDES's E_Δ (see Embeddings)."""
        cfg = self.config
        x = self.embeddings(input_ids, segment_ids, deterministic, prompt, positions,
                            word_delta)
        ctx = context(cfg, input_mask, positions, pack_ids)
        if cfg.position_embedding == "relative":
            ctx = ctx.replace(relative=self.relative_embeddings())
        embedded = x
        layers = {name: getattr(self, name) for name in layer_names(cfg)}
        carried, stacked = run_layers(cfg, layers, (x, x) if self.keep_last_input else x, ctx,
                                      deterministic, self.all_layers)
        x, last_input = carried if self.keep_last_input else (carried, None)
        if cfg.norm == "pre":
            x = self.final_norm(x).astype(cfg.dtype)
            if self.all_layers:  # Hugging Face's last hidden state is after the final norm
                stacked = stacked.at[-1].set(x)
        first = x[:, 0] if pool_positions is None else gather_positions(x, pool_positions)
        pooled = jnp.tanh(self.pooler(first))
        layers = jnp.concatenate([embedded[None], stacked]) if self.all_layers else None
        return EncoderOutput(sequence=x, pooled=pooled, layers=layers, last_input=last_input)

    def attend(self, x: Array) -> Array:
        """The output projection tied to the word embeddings: x [..., H] -> fp32 [..., V]."""
        return self.embeddings.attend(x)
