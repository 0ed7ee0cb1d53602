"""bf16 against fp32 matrix products on this machine's CPU, XLA (jax) and oneDNN (torch) side by
side: the products of a BERT-base layer at 8 x 128 tokens (the QKV/output projections and the
feed-forward), timed alternately, GFLOP/s and each framework's bf16 / fp32 ratio.

    python benchmarks/cpu_bf16_matmul.py [--tokens 1024] [--hidden 768] [--repeats 20]

XLA's bf16 product takes bf16 inputs and accumulates in fp32 (preferred_element_type, what the
model's bf16 mode does); torch's is `a @ b` on bf16 tensors (what torch.autocast runs).
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


if __name__ == "__main__":
    main()
