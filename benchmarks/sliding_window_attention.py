"""Sliding-window attention block by block against a masked [L, L] matrix: forward + backward
time and XLA's FLOP estimate of each, at ModernBert's window (half window 64) by default.

    python benchmarks/sliding_window_attention.py [--lengths 512 2048] [--batch 2] [--heads 12]
        [--head-dim 64] [--half-window 64] [--repeats 10]

Compared, each a jitted gradient of sum(attention * cotangent) with respect to query, key and
value, on [B, L, N, D] fp32 inputs with a suffix of padding in the second row:
  blocked   bertjax.model.local_attention.sliding_window_attention (3w keys per query block)
  dpa       jax.nn.dot_product_attention under the [L, L] band mask
  einsum    the explicit fp32-softmax computation (model/attention.py) under the same mask
Times are medians of --repeats runs after a warm-up, wall clock on whatever else the machine
runs. FLOPs are XLA's cost model of the compiled step, not a count of the useful work.
"""

from __future__ import annotations

import argparse
import statistics
import time

import jax
import jax.numpy as jnp
import numpy as np

from bertjax.model.local_attention import band_mask, sliding_window_attention

FILL = jnp.float32(-0.7) * jnp.finfo(jnp.float32).max


def blocked(half_window: int):
    return lambda q, k, v, key_mask: sliding_window_attention(q, k, v, key_mask, half_window)


def dpa(half_window: int):
    def attend(q, k, v, key_mask):
        mask = key_mask[:, None, None, :] & band_mask(q.shape[1], half_window)[None, None]
        return jax.nn.dot_product_attention(q, k, v, mask=mask)
    return attend


def einsum(half_window: int):
    def attend(q, k, v, key_mask):
        mask = key_mask[:, None, None, :] & band_mask(q.shape[1], half_window)[None, None]
        logits = jnp.einsum("btnd,bsnd->bnts", q, k, preferred_element_type=jnp.float32)
        logits = jnp.where(mask, logits / jnp.sqrt(jnp.float32(q.shape[-1])), FILL)
        probs = jax.nn.softmax(logits, axis=-1)
        return jnp.einsum("bnts,bsnd->btnd", probs.astype(v.dtype), v)
    return attend


def training_step(attend):
    """Forward + backward: gradients of <attend(q, k, v), cotangent> in q, k and v."""
    def loss(q, k, v, key_mask, cotangent):
        return jnp.sum(attend(q, k, v, key_mask) * cotangent)
    return jax.jit(jax.grad(loss, argnums=(0, 1, 2)))


def median_seconds(step, arguments, repeats: int) -> float:
    jax.block_until_ready(step(*arguments))
    spent = []
    for _ in range(repeats):
        started = time.perf_counter()
        jax.block_until_ready(step(*arguments))
        spent.append(time.perf_counter() - started)
    return statistics.median(spent)


def estimated_flops(step, arguments) -> float:
    analysis = step.lower(*arguments).compile().cost_analysis()
    if isinstance(analysis, (list, tuple)):  # older jax: one dict per computation
        analysis = analysis[0]
    return float(analysis.get("flops", float("nan")))


def arguments_of(length: int, args, rng) -> tuple:
    shape = (args.batch, length, args.heads, args.head_dim)
    q, k, v, cotangent = (jnp.asarray(rng.standard_normal(shape), jnp.float32) for _ in range(4))
    key_mask = np.ones((args.batch, length), bool)
    key_mask[-1, length - length // 4:] = False
    return q, k, v, jnp.asarray(key_mask), cotangent


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--lengths", type=int, nargs="+", default=[512, 2048])
    p.add_argument("--batch", type=int, default=2)
    p.add_argument("--heads", type=int, default=12)
    p.add_argument("--head-dim", type=int, default=64)
    p.add_argument("--half-window", type=int, default=64)
    p.add_argument("--repeats", type=int, default=10)
    args = p.parse_args()
    rng = np.random.default_rng(0)
    kinds = {"blocked": blocked, "dpa": dpa, "einsum": einsum}
    print(f"{jax.devices()[0].device_kind}, jax {jax.__version__}; forward + backward, fp32, "
          f"B={args.batch} N={args.heads} D={args.head_dim} half window {args.half_window}; "
          f"GFLOP: XLA cost-model estimate")
    print("| L | blocked ms | dpa ms | einsum ms | dpa / blocked | einsum / blocked "
          "| blocked GFLOP | dpa GFLOP | einsum GFLOP |")
    print("|---|---|---|---|---|---|---|---|---|")
    for length in args.lengths:
        arguments = arguments_of(length, args, rng)
        steps = {name: training_step(make(args.half_window)) for name, make in kinds.items()}
        ms = {name: 1e3 * median_seconds(step, arguments, args.repeats)
              for name, step in steps.items()}
        gflop = {name: estimated_flops(step, arguments) / 1e9 for name, step in steps.items()}
        print(f"| {length} | {ms['blocked']:.1f} | {ms['dpa']:.1f} | {ms['einsum']:.1f} "
              f"| {ms['dpa'] / ms['blocked']:.2f}x | {ms['einsum'] / ms['blocked']:.2f}x "
              f"| {gflop['blocked']:.2f} | {gflop['dpa']:.2f} | {gflop['einsum']:.2f} |")


if __name__ == "__main__":
    main()
