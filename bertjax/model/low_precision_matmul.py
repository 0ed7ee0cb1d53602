"""A matmul of low-precision (bf16) operands whose backward pass stays on the fast kernels.

XLA's CPU backend runs a bf16 x bf16 -> f32 product on YNNPACK's bf16 kernels (with AVX512-BF16,
about twice the fp32 rate) only when the left operand contracts its last,
contiguous dimension. Autodiff's weight gradient, dW[k, n] = sum_m x[m, k] dy[m, n], contracts
the rows of both operands; XLA then folds the transpose it would need into the product and, the
product being unsupported in that form, widens both operands to fp32 (measured on a 1024 x 768 x
3072 product: 199 GFLOP/s against 408 for the forward product). Transposing the activations
with a reshape round-trip that XLA cannot fold into the product gives it the supported form
(375-388 GFLOP/s, the copy included).

`matmul_2d` is that product with a custom VJP, for 2-D operands; `einsum` flattens a layer's
product (the encoder's projections, dense layers and tied output layer) onto it;
`use_fast_gradients` says when it pays: bf16 operands compiled for a CPU (GPUs and TPUs take
any form at full rate, and there the copy would only cost).
"""

from __future__ import annotations

import math
from functools import partial

import jax
import jax.numpy as jnp

from bertjax.model.target_platform import target_platform

Array = jax.Array


def use_fast_gradients(operand_dtype: str) -> bool:
    return jnp.dtype(operand_dtype) == jnp.bfloat16 and target_platform() == "cpu"


def _materialized_transpose(x: Array) -> Array:
    """x [M, K] -> [K, M] as a copy in row-major layout (a plain .T is folded into the product,
    and an element-wise op after it inherits its transposed layout)."""
    rows, cols = x.shape
    return x.reshape(rows, cols, 1).transpose(1, 0, 2).reshape(cols, rows)


def _product(x: Array, w: Array, result_dtype, w_transposed: bool = False) -> Array:
    contracting = ((1,), (1,)) if w_transposed else ((1,), (0,))
    return jax.lax.dot_general(x, w, (contracting, ((), ())), preferred_element_type=result_dtype)


def matmul_2d(x: Array, w: Array, operand_dtype: str, result_dtype: str,
              w_transposed: bool = False) -> Array:
    """x [M, K] @ w [K, N] (w [N, K] with `w_transposed`, as a tied output layer stores it),
    both cast to `operand_dtype`, accumulated into `result_dtype`. Gradients come back in x's
    and w's own dtypes (fp32 master weights get fp32 gradients, accumulated in fp32 from bf16
    operands, as autodiff of the cast product gives them)."""
    return _matmul_2d(x, w, operand_dtype, result_dtype, w_transposed, str(x.dtype),
                      str(w.dtype))


@partial(jax.custom_vjp, nondiff_argnums=(2, 3, 4, 5, 6))
def _matmul_2d(x, w, operand_dtype, result_dtype, w_transposed, x_dtype, w_dtype):
    return _product(x.astype(operand_dtype), w.astype(operand_dtype), result_dtype, w_transposed)


def _forward(x, w, operand_dtype, result_dtype, w_transposed, x_dtype, w_dtype):
    x_low, w_low = x.astype(operand_dtype), w.astype(operand_dtype)
    return _product(x_low, w_low, result_dtype, w_transposed), (x_low, w_low)


def _backward(operand_dtype, result_dtype, w_transposed, x_dtype, w_dtype, residuals, dy):
    x_low, w_low = residuals
    dy_low = dy.astype(operand_dtype)
    f32 = jnp.float32
    if w_transposed:
        # dx = dy [M, N] @ w [N, K]; dw [N, K] = dy^T @ x, computed in w's own layout (a
        # transpose of the result would be folded back into the unsupported form).
        dx = _product(dy_low, w_low, f32)
        dw = _product(_materialized_transpose(dy_low), x_low, f32)
    else:
        # dx[m, k] = sum_n dy[m, n] w[k, n]: both contract their last dimension (supported).
        dx = _product(dy_low, w_low, f32, w_transposed=True)
        dw = _product(_materialized_transpose(x_low), dy_low, f32)
    return dx.astype(x_dtype), dw.astype(w_dtype)


_matmul_2d.defvjp(_forward, _backward)


def einsum(equation: str, x: Array, kernel: Array, operand_dtype: str,
           result_dtype: str) -> Array:
    """`equation` (trailing axes of x contracted with the leading, or for a kernel stored
    transposed the trailing, axes of `kernel`; free axes in order) through matmul_2d, both
    operands flattened to 2-D."""
    inputs, output = equation.replace("...", "").split("->")
    lhs, rhs = inputs.split(",")
    contracted = len(set(lhs) & set(rhs))
    transposed = rhs[-contracted:] == lhs[-contracted:]
    assert transposed or rhs[:contracted] == lhs[-contracted:], equation
    assert output == lhs[:len(lhs) - contracted] + (
        rhs[:-contracted] if transposed else rhs[contracted:]), equation
    depth = math.prod(x.shape[-contracted:])
    if transposed:
        free = kernel.shape[:-contracted]
        w = kernel.reshape(-1, depth)
    else:
        free = kernel.shape[contracted:]
        w = kernel.reshape(depth, -1)
    y = matmul_2d(x.reshape(-1, depth), w, operand_dtype, result_dtype, transposed)
    return y.reshape(*x.shape[:-contracted], *free)
