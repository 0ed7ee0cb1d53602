"""Trainable parameters and optimizer-state bytes of full, adapter and LoRA fine-tuning.

The train state is built as a fine-tuning run builds it (a 2-label sequence classifier, AdamW,
the method's freezing), from shapes alone (jax.eval_shape: nothing is allocated), so any size
can be measured on any machine.

    python benchmarks/finetune_method_memory.py [--model tiny] [--model PATH ...]

--model is a preset name (tiny .. large; 30,522-token vocabulary) or a checkpoint whose shape is
read (a workdir, a params export, a Hugging Face directory such as the packaged MiniLM).
"""

from __future__ import annotations

import argparse
import functools
import math

import jax
import numpy as np

from bertjax.inference import loading
from bertjax.model import adaptation
from bertjax.model.config import PRESETS, preset
from bertjax.model.task_heads import SequenceClassifier
from bertjax.parallel.mesh import make_mesh
from bertjax.settings import methods
from bertjax.train.freezing import path_name, train_only
from bertjax.train.optimizer import OptimizerConfig, make_optimizer
from bertjax.train.state import abstract_train_state
from configs import finetune_base

METHODS = ("full", "adapter", "lora")


def measure(base, method: str) -> dict:
    section = finetune_base.get_config().finetune  # the method's defaults, as a run reads them
    section.method = method
    settings = methods.read(section)
    model_config = settings.encoder(base)
    model = SequenceClassifier(model_config, 2)
    optimizer = make_optimizer(OptimizerConfig(total_steps=100, warmup_steps=10,
                                               bias_correction=True))
    trains = None
    if settings.freezes_base:
        trains = functools.partial(adaptation.trains, method=method)
        optimizer = train_only(optimizer, trains)
    shapes = {k: jax.ShapeDtypeStruct((8, 16), np.int32)
              for k in ("input_ids", "segment_ids", "input_mask", "label")}
    state, _ = abstract_train_state(model, optimizer, shapes, make_mesh(devices=jax.devices()[:1]))
    leaves = jax.tree_util.tree_leaves_with_path(state.params)
    total = sum(math.prod(x.shape) for _, x in leaves)
    trained = sum(math.prod(x.shape) for p, x in leaves
                  if trains is None or trains(path_name(p)))
    opt_bytes = sum(math.prod(x.shape) * x.dtype.itemsize
                    for x in jax.tree.leaves(state.opt_state))
    return {"total": total, "trained": trained, "opt_bytes": opt_bytes}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", action="append", default=None)
    args = parser.parse_args()
    for name in args.model or ["tiny"]:
        base = (preset(name) if name in PRESETS
                else loading.describe(name).require_encoder())
        print(f"{name}: {base.num_layers} layers, hidden {base.hidden_size}")
        print(f"  {'method':8s} {'parameters':>12s} {'trained':>12s} {'%':>7s} "
              f"{'optimizer state':>16s}")
        for method in METHODS:
            r = measure(base, method)
            print(f"  {method:8s} {r['total']:12,d} {r['trained']:12,d} "
                  f"{100 * r['trained'] / r['total']:7.2f} {r['opt_bytes'] / 2**20:12.2f} MiB")


if __name__ == "__main__":
    main()
