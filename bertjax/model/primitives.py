"""The building blocks every module of the model shares: initialisers carrying logical axis
names, dense layers whose matmuls run in the config's operand dtype, fp32 LayerNorm, exact GELU.

Every parameter carries logical axis names (`nn.with_logical_partitioning`); they are inert until
the caller supplies a rules table and a mesh, so the model also runs unsharded.
"""

from __future__ import annotations

from typing import Callable

import flax.linen as nn
import jax
import jax.numpy as jnp

from bertjax.model import low_precision_matmul
from bertjax.model.config import EncoderConfig

Array = jax.Array


def kernel_init(config: EncoderConfig, names: tuple) -> Callable:
    """BERT's init, normal(initializer_range), carrying logical axis names."""
    return nn.with_logical_partitioning(nn.initializers.normal(config.initializer_range), names)


def zeros_init(names: tuple) -> Callable:
    return nn.with_logical_partitioning(nn.initializers.zeros_init(), names)


def layer_norm(config: EncoderConfig, name: str) -> nn.LayerNorm:
    # Two-pass variance (not E[x^2] - E[x]^2) to match torch's LayerNorm to fp32 rounding.
    return nn.LayerNorm(
        epsilon=config.layer_norm_eps, dtype=jnp.float32, param_dtype=config.param_dtype,
        use_fast_variance=False, use_bias=config.norm_bias,
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
          dtype: str | None = None, use_bias: bool = True) -> nn.Dense:
    """A Dense whose kernel is named `names` and whose bias (if any) takes the output axis name."""
    # A head that asks for its own dtype (fp32 scores) keeps operands of that dtype too.
    extra = {}
    if dtype is None and (config.operand_dtype != config.dtype
                          or low_precision_matmul.use_fast_gradients(config.operand_dtype)):
        extra["dot_general"] = _dot_in(config.operand_dtype, config.dtype)
    dtype = dtype or config.dtype
    return nn.Dense(
        features, dtype=dtype, param_dtype=config.param_dtype,
        kernel_init=kernel_init(config, names), bias_init=zeros_init(names[-1:]), name=name,
        use_bias=use_bias, **extra)


def gelu(x: Array) -> Array:
    return jax.nn.gelu(x, approximate=False)


def activate(config: EncoderConfig, x: Array) -> Array:
    """The config's activation: exact GELU, or its tanh approximation (model.activation)."""
    return jax.nn.gelu(x, approximate=config.activation == "gelu_tanh")


def gather_positions(sequence: Array, positions: Array) -> Array:
    """sequence [B, L, H] at positions [B, P] -> [B, P, H]."""
    return jnp.take_along_axis(sequence, positions[..., None].astype(jnp.int32), axis=1)


class EinsumDense(nn.Module):
    """`einsum(equation, x, kernel) + bias` in the compute dtype; the bias (unless `use_bias` is
    off) spans the kernel's last `out_dims` axes. (Flax's DenseGeneral initialises a flattened
    kernel and reshapes it, which breaks its own logical sharding constraint once axis rules are
    active.)"""

    config: EncoderConfig
    equation: str
    kernel_shape: tuple[int, ...]
    kernel_axes: tuple[str | None, ...]
    out_dims: int = 1
    use_bias: bool = True

    @nn.compact
    def __call__(self, x: Array) -> Array:
        cfg = self.config
        kernel = self.param("kernel", kernel_init(cfg, self.kernel_axes), self.kernel_shape,
                            cfg.param_dtype)
        y = matmul(self.equation, x, kernel, cfg)
        if not self.use_bias:
            return y
        bias = self.param("bias", zeros_init(self.kernel_axes[-self.out_dims:]),
                          self.kernel_shape[-self.out_dims:], cfg.param_dtype)
        return y + bias.astype(cfg.dtype)
