"""Parameter-efficient fine-tuning of the encoder: Houlsby adapters and LoRA.

    Adapter         (Houlsby et al., 2019) h + up(gelu(down(h))), down to `adapter_size`; after
                    the attention output and after the feed-forward output of every layer, before
                    the residual add and LayerNorm. `up` starts near zero, so the adapted model
                    starts as (almost exactly) the pretrained one.
    LowRankUpdate   (Hu et al., 2021) scale * (dropout(x) @ a) @ b added to the query and value
                    projections; `a` random, `b` zero, scale = lora_alpha / lora_rank.

Their parameters sit beside the base model's (`attention_adapter`, `output_adapter` in a layer;
`query_lora`, `value_lora` in its attention) and rename none of them: a base checkpoint loads by
name unchanged, and the base weights stay frozen (`trains`). A LoRA update folds into the base
projection (`merge_lora`), which gives back a plain BERT.
"""

from __future__ import annotations

import re
from typing import Any, Mapping, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np

from bertjax.model.config import EncoderConfig

METHODS = ("adapter", "lora")
ADAPTER_SUFFIX, LORA_SUFFIX = "_adapter", "_lora"
LORA_TARGETS = ("query", "value")
# Houlsby et al. found any init std up to 1e-2 works; small keeps the start near the base model.
ADAPTER_UP_STD = 1e-3
# The norms of the encoder (embeddings' `layer_norm`, a layer's `attention_norm`, `output_norm`).
_NORM = re.compile(r"(^|_)norm$")


def _init(initializer, names: tuple):
    return nn.with_logical_partitioning(initializer, names)


class Adapter(nn.Module):
    """x [B, L, H] -> x + up(gelu(down(x))), computed in the compute dtype."""

    config: EncoderConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        cfg = self.config
        zeros = nn.initializers.zeros_init()

        def dense(features, std, names, name):
            return nn.Dense(features, dtype=cfg.dtype, param_dtype=cfg.param_dtype,
                            kernel_init=_init(nn.initializers.normal(std), names),
                            bias_init=_init(zeros, names[-1:]), name=name)

        h = dense(cfg.adapter_size, cfg.initializer_range, ("embed", None), "down")(x)
        h = jax.nn.gelu(h, approximate=False)
        h = dense(cfg.hidden_size, ADAPTER_UP_STD, (None, "embed"), "up")(h)
        return x + h.astype(x.dtype)


class LowRankUpdate(nn.Module):
    """x [B, L, H] -> the LoRA update of a [H, N, D] head projection, [B, L, N, D]."""

    config: EncoderConfig

    @nn.compact
    def __call__(self, x: jax.Array, deterministic: bool) -> jax.Array:
        cfg = self.config
        # a as peft's kaiming_uniform(sqrt(5)): uniform with variance 1 / (3 fan_in).
        a = self.param("a", _init(nn.initializers.variance_scaling(1 / 3, "fan_in", "uniform"),
                                  ("embed", None)), (cfg.hidden_size, cfg.lora_rank),
                       cfg.param_dtype)
        b = self.param("b", _init(nn.initializers.zeros_init(), (None, "heads", "kv")),
                       (cfg.lora_rank, cfg.num_heads, cfg.head_dim), cfg.param_dtype)
        x = nn.Dropout(cfg.lora_dropout)(x, deterministic=deterministic)
        dtype = cfg.dtype
        low = jnp.einsum("blh,hr->blr", x.astype(dtype), a.astype(dtype))
        update = jnp.einsum("blr,rnd->blnd", low, b.astype(dtype))
        return update * jnp.asarray(cfg.lora_scale, dtype)


def added(name: str) -> bool:
    """Whether the parameter `name` belongs to an adapter or a LoRA update (no base model has
    it: a warm start leaves it as initialized)."""
    return any(m.endswith((ADAPTER_SUFFIX, LORA_SUFFIX)) for m in name.split("/")[:-1])


def trains(name: str, method: str, fresh: Sequence[str] = ()) -> bool:
    """Whether `method` trains the parameter `name` ('/'-joined path in the task model): the task
    head, the method's own parameters (the adapter method also the LayerNorms, as Houlsby et al.),
    and `fresh` encoder subtrees the warm start initialized (an untrained pooler) rather than
    loaded. The base encoder's other parameters stay frozen."""
    parts = name.split("/")
    if parts[0] != "encoder" or any(name == f or name.startswith(f + "/") for f in fresh):
        return True
    if method in METHODS:
        return added(name) or (method == "adapter" and any(_NORM.search(m) for m in parts[:-1]))
    return True


def merge_lora(params: Mapping[str, Any], config: EncoderConfig) -> tuple[dict, EncoderConfig]:
    """(params with every LoRA update folded into its projection kernel, the base config):
    W + scale * a @ b, in float64 then cast back. Works on either layer layout (a scanned
    layer's arrays carry a leading layer axis)."""
    if not config.lora_rank:
        return dict(params), config
    scale = config.lora_scale

    def fold(tree):
        if not isinstance(tree, Mapping):
            return tree
        out = {k: fold(v) for k, v in tree.items() if not k.endswith(LORA_SUFFIX)}
        for target in LORA_TARGETS:
            update = tree.get(target + LORA_SUFFIX)
            if update is None:
                continue
            kernel = np.asarray(tree[target]["kernel"])
            a = np.asarray(update["a"], np.float64)
            b = np.asarray(update["b"], np.float64)
            merged = kernel.astype(np.float64) + scale * np.einsum("...hr,...rnd->...hnd", a, b)
            out[target] = {**tree[target], "kernel": merged.astype(kernel.dtype)}
        return out

    return fold(params), config.replace(lora_rank=0)
