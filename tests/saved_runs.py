"""Workdirs as a run leaves them, made without training: random parameters of a model's shapes, saved
as an Orbax train state with a run record."""

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax.jobs.run_directory import RunDirectory
from bertjax.model.config import EncoderConfig
from bertjax.train.checkpoint import Checkpointer
from bertjax.train.state import TrainState

STEP = 7  # the step of the saved checkpoint


def random_params(model: nn.Module, inputs: tuple, seed: int) -> dict:
    """Random values in every parameter (LayerNorm scales near 1), from shapes alone."""
    shapes = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), *inputs)["params"])
    rng = np.random.default_rng(seed)

    def draw(path, s):
        base = 1.0 if getattr(path[-1], "key", "") == "scale" else 0.0
        return (base + 0.1 * rng.standard_normal(s.shape)).astype(s.dtype)

    return jax.tree_util.tree_map_with_path(draw, shapes)


def save_workdir(workdir: str, params: dict, encoder: EncoderConfig, *, task: str, heads: dict,
                 tokenizer_dir: str) -> str:
    """A workdir as a run leaves it: an Orbax train state (with AdamW moments) and run.json."""
    params = jax.tree.map(jnp.asarray, params)
    state = TrainState(step=jnp.int32(STEP), params=params,
                       opt_state=optax.adamw(1e-3).init(params), rng=jax.random.PRNGKey(0))
    with Checkpointer(workdir) as checkpointer:
        checkpointer.save(STEP, state, {"position": STEP})
    RunDirectory(workdir).write_record({"task": task}, info={
        "task": task, "encoder": dataclasses.asdict(encoder), "heads": heads,
        "tokenizer_dir": tokenizer_dir})
    return workdir


def api_config(scan: bool) -> EncoderConfig:
    """The small encoder of the API's tests (the `pretrained` fixture of conftest.py)."""
    return EncoderConfig(vocab_size=30522, hidden_size=32, num_heads=4, intermediate_size=48,
                         num_layers=3, max_position_embeddings=64, scan_layers=scan)
