"""bf16 against fp32 matrix products on this machine's CPU, XLA (jax) and oneDNN (torch) side by
side: the products of a BERT-base layer at 8 x 128 tokens (the QKV/output projections and the
feed-forward), timed alternately, GFLOP/s and each framework's bf16 / fp32 ratio.

    python benchmarks/cpu_bf16_matmul.py [--tokens 1024] [--hidden 768] [--repeats 20]

XLA's bf16 product takes bf16 inputs and accumulates in fp32 (preferred_element_type, what the
model's bf16 mode does); torch's is `a @ b` on bf16 tensors (what torch.autocast runs).

A second table times a training step's three products (forward, input and weight gradients) of
each shape in XLA: fp32, bf16 as autodiff differentiates the cast product (XLA widens its weight
gradient to fp32), and bf16 through bertjax.model.low_precision_matmul (what the model runs).
"""

from __future__ import annotations

import argparse
import os
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np


def timed(fn, repeats: int) -> float:
    fn()
    spent = []
    for _ in range(repeats):
        started = time.perf_counter()
        fn()
        spent.append(time.perf_counter() - started)
    return statistics.median(spent)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokens", type=int, default=1024)
    p.add_argument("--hidden", type=int, default=768)
    p.add_argument("--repeats", type=int, default=20)
    args = p.parse_args()
    import torch

    torch.set_num_threads(len(os.sched_getaffinity(0)))
    t, h = args.tokens, args.hidden
    shapes = {"projection h x h": (t, h, h), "feed-forward h x 4h": (t, h, 4 * h),
              "feed-forward 4h x h": (t, 4 * h, h)}
    rng = np.random.default_rng(0)
    print(f"CPU: {jax.devices()[0].device_kind}, jax {jax.__version__}, torch {torch.__version__} "
          f"({torch.get_num_threads()} threads)")
    print("| product | XLA fp32 GFLOP/s | XLA bf16 GFLOP/s | XLA bf16/fp32 | torch fp32 | "
          "torch bf16 | torch bf16/fp32 |")
    print("|---|---|---|---|---|---|---|")
    for name, (m, k, n) in shapes.items():
        a, b = rng.standard_normal((m, k), np.float32), rng.standard_normal((k, n), np.float32)
        flops = 2 * m * k * n / 1e9
        fp32 = jax.jit(lambda x, y: x @ y)
        bf16 = jax.jit(lambda x, y: jnp.matmul(x, y, preferred_element_type=jnp.float32))
        ja, jb = jnp.asarray(a), jnp.asarray(b)
        ja16, jb16 = ja.astype(jnp.bfloat16), jb.astype(jnp.bfloat16)
        ta, tb = torch.from_numpy(a), torch.from_numpy(b)
        ta16, tb16 = ta.bfloat16(), tb.bfloat16()
        figures = []
        for fn in (lambda: fp32(ja, jb).block_until_ready(),
                   lambda: bf16(ja16, jb16).block_until_ready(),
                   lambda: ta @ tb, lambda: ta16 @ tb16):
            figures.append(flops / timed(fn, args.repeats))
        print(f"| {name} ({m}x{k} @ {k}x{n}) | {figures[0]:.0f} | {figures[1]:.0f} | "
              f"{figures[1] / figures[0]:.2f}x | {figures[2]:.0f} | {figures[3]:.0f} | "
              f"{figures[3] / figures[2]:.2f}x |")

    print()
    print("| products of a training step (XLA) | fp32 GFLOP/s | bf16, autodiff | "
          "bf16, low_precision_matmul | low_precision_matmul / fp32 |")
    print("|---|---|---|---|---|")
    for name, (m, k, n) in shapes.items():
        figures = [3 * 2 * m * k * n / 1e9 / timed(step, args.repeats)
                   for step in training_products(rng, m, k, n)]
        print(f"| {name} ({m}x{k} @ {k}x{n}) | {figures[0]:.0f} | {figures[1]:.0f} | "
              f"{figures[2]:.0f} | {figures[2] / figures[0]:.2f}x |")


def training_products(rng, m: int, k: int, n: int):
    """Steppers running forward + both gradients of x [m, k] @ w [k, n]: fp32, bf16 by autodiff,
    bf16 by low_precision_matmul."""
    from bertjax.model.low_precision_matmul import matmul_2d

    x = jnp.asarray(rng.standard_normal((m, k)), jnp.float32)
    w = jnp.asarray(rng.standard_normal((k, n)), jnp.float32)
    products = (lambda a, b: a @ b,
                lambda a, b: jnp.matmul(a.astype(jnp.bfloat16), b.astype(jnp.bfloat16),
                                        preferred_element_type=jnp.float32),
                lambda a, b: matmul_2d(a, b, "bfloat16", "float32"))
    steppers = []
    for product in products:
        step = jax.jit(jax.value_and_grad(lambda a, b, p=product: jnp.sum(p(a, b) ** 2),
                                          argnums=(0, 1)))
        steppers.append(lambda step=step: jax.block_until_ready(step(x, w)))
    return steppers


if __name__ == "__main__":
    main()
