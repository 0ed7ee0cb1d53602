"""A diagnostic for ELECTRA's discriminator on a language it should find easy: every row is an
arithmetic run of token ids (t, t+1, t+2, ... mod V), 5 of 32 positions masked. The generator
learns the runs (MLM accuracy 0.4-0.5 by step 800, 0.97 by step 2,000, with a generator as wide
as the discriminator); a replaced token then breaks the run, so a working discriminator should
flag some. It does not (precision and recall 0, loss at the entropy of the replaced rate for
3,000 steps): the open ELECTRA defect this script reproduces (README "Objectives compared").

    python benchmarks/electra_rtd_probe.py [--steps 800] [--weight 50] [--generator same|small]
"""

from __future__ import annotations

import argparse

import jax
import numpy as np
import optax

from bertjax.model.config import preset
from bertjax.model.electra import ElectraForPretraining
from bertjax.train import electra_objective

V, B, L, P = 200, 32, 32, 5
MASK_ID = 3


def batch(rng: np.random.Generator) -> dict:
    start = rng.integers(5, V, B)
    ids = (start[:, None] + np.arange(L)[None]) % (V - 5) + 5
    positions = np.stack([np.sort(rng.choice(np.arange(1, L), P, replace=False))
                          for _ in range(B)])
    inputs = ids.copy()
    np.put_along_axis(inputs, positions, MASK_ID, 1)
    return {"input_ids": inputs.astype(np.int32), "segment_ids": np.zeros((B, L), np.int32),
            "input_mask": np.ones((B, L), np.int32),
            "masked_positions": positions.astype(np.int32),
            "masked_ids": np.take_along_axis(ids, positions, 1).astype(np.int32),
            "masked_weights": np.ones((B, P), np.float32)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=800)
    p.add_argument("--weight", type=float, default=50.0, help="lambda")
    p.add_argument("--generator", choices=("same", "small"), default="same")
    args = p.parse_args()
    disc = preset("tiny", vocab_size=V, max_position_embeddings=64, hidden_dropout=0.0,
                  attention_dropout=0.0)
    gen = disc if args.generator == "same" else disc.replace(hidden_size=64, num_heads=1,
                                                             intermediate_size=256)
    model = ElectraForPretraining(disc, gen)
    objective = electra_objective.electra_objective(args.weight)
    rng = np.random.default_rng(0)
    params = model.init({"params": jax.random.PRNGKey(0), "dropout": jax.random.PRNGKey(1)},
                        batch(rng), deterministic=False)["params"]
    optimizer = optax.adamw(1e-3)
    state = optimizer.init(params)

    @jax.jit
    def step(params, state, b, key):
        def loss(p):
            out = model.apply({"params": p}, b, deterministic=False, rngs={"dropout": key})
            sums = objective.metric_sums(out, b)
            return objective.loss_from_sums(sums), sums

        (_, sums), grads = jax.value_and_grad(loss, has_aux=True)(params)
        updates, state = optimizer.update(grads, state, params)
        return optax.apply_updates(params, updates), state, sums

    shown = ("mlm_accuracy", "rtd_loss", "rtd_precision", "rtd_recall", "replaced_fraction")
    for i in range(args.steps):
        params, state, sums = step(params, state, batch(rng), jax.random.PRNGKey(i))
        if (i + 1) % 50 == 0:
            figures = objective.summarize({k: float(v) for k, v in sums.items()})
            print(i + 1, {k: round(figures[k], 3) for k in shown}, flush=True)


if __name__ == "__main__":
    main()
