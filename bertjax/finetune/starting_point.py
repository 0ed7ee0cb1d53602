"""Where a fine-tuning run starts: the encoder's shape, the tokenizer, and the initial parameters.

Sources (`config.init_checkpoint`): a pretraining or fine-tuning workdir, or a params export
(e.g. `python -m bertjax.convert --from-hf` output); with none, the model is trained from scratch
(`model.preset` names its size and `data.tokenizer` its vocabulary).

Only the encoder is loaded (every path under `encoder/`, the pooler included); heads of the source
(MLM, NSP, another task's classifier) are dropped by pattern and the new head keeps its fresh
initialization. `reinit_top_layers=k` then puts the fresh initialization back into the top k
layers and the pooler (top layers are the most specific to the pretraining objectives): for a
scanned encoder, whose layers are stacked in one array per parameter, by taking the fresh
array's slices for those layer indices.

A frozen encoder (feature-based fine-tuning) is two things: the model runs the encoder
deterministically under stop_gradient (no backward pass through it), and the optimizer's updates
to its parameters are zeroed, which also keeps weight decay off them.
"""

from __future__ import annotations

import dataclasses
import os
import re
import sys
from typing import Any

import jax
import jax.numpy as jnp
import ml_collections
import optax

from bertjax import builders
from bertjax.data.tokenizer import Tokenizer, load_tokenizer
from bertjax.errors import UserError
from bertjax.interop import params_dir
from bertjax.model.config import EncoderConfig
from bertjax.train import init_checkpoint

ENCODER_ONLY = (r"^(?!encoder/)",)  # skip patterns: everything that is not the encoder


@dataclasses.dataclass
class Start:
    encoder: EncoderConfig
    tokenizer: Tokenizer
    source: str  # the init checkpoint, or "" from scratch


def starting_point(config: ml_collections.ConfigDict, init: str, tokenizer_path: str) -> Start:
    """The encoder config and tokenizer; refuses a tokenizer that does not fit the embeddings."""
    if not init and config.model.preset == builders.FROM_CHECKPOINT:
        raise UserError("set config.init_checkpoint (a pretraining workdir or params export) "
                        "or, to train from scratch, a model.preset and data.tokenizer")
    recorded_dir = None
    if init:
        _, recorded_dir = params_dir.recorded_model(init)
    path = tokenizer_path or recorded_dir
    if not path:
        raise UserError(f"no tokenizer: {init or 'training from scratch'} records none; set "
                        "--config.data.tokenizer to the vocabulary")
    tokenizer = load_tokenizer(path)
    encoder = builders.encoder_config(config, tokenizer.vocab_size, tokenizer.special.pad)
    if tokenizer.vocab_size != encoder.vocab_size:
        raise UserError(f"vocabulary mismatch: the tokenizer {path} has {tokenizer.vocab_size} "
                        f"tokens, the model from {init or 'the config'} embeds "
                        f"{encoder.vocab_size}; use the checkpoint's own vocabulary")
    return Start(encoder, tokenizer, init)


def load_encoder(source: str, params: Any, shardings: Any, reinit_top_layers: int,
                 num_layers: int) -> Any:
    """`params` with the encoder of `source` loaded (see the module doc)."""
    bundle = params_dir.load_any(source)
    merged, loaded, kept = init_checkpoint.merge(params, shardings, bundle.params, ENCODER_ONLY)
    missing = [name for name in kept if name.startswith("encoder/")]
    if missing:
        raise UserError(f"the init checkpoint {source} lacks encoder parameter(s) "
                        f"{', '.join(missing[:3])}: not a BERT encoder of this shape")
    if reinit_top_layers:
        if reinit_top_layers > num_layers:
            raise UserError(f"finetune.reinit_top_layers={reinit_top_layers} exceeds the "
                            f"encoder's {num_layers} layers")
        merged = reinitialize_top_layers(merged, params, shardings, reinit_top_layers,
                                         num_layers)
    if jax.process_index() == 0:
        fresh = sorted({"/".join(n.split("/")[:1]) for n in kept})
        note = f" and the top {reinit_top_layers} layer(s) + pooler" if reinit_top_layers else ""
        print(f"loaded the encoder ({len(loaded)} arrays) from {source}; initialized fresh: "
              f"{', '.join(fresh)}{note}", file=sys.stderr)
    return merged


def _layer_of(names: list[str]) -> str | None:
    """'layers' (stacked), 'pooler', 'layer_N', or None for a path outside the encoder's top."""
    if len(names) < 2 or names[0] != "encoder":
        return None
    return names[1]


def reinitialize_top_layers(loaded: Any, fresh: Any, shardings: Any, k: int,
                            num_layers: int) -> Any:
    """The fresh values in the top k layers and the pooler, the loaded ones elsewhere."""
    first_fresh = num_layers - k

    def pick(path, old, new):
        where = _layer_of([str(getattr(key, "key", key)) for key in path])
        if where == "pooler":
            return new
        if where == "layers":  # stacked: [num_layers, ...]
            top = jnp.arange(num_layers) >= first_fresh
            return jnp.where(top.reshape((-1,) + (1,) * (old.ndim - 1)), new, old)
        match = re.fullmatch(r"layer_(\d+)", where or "")
        return new if match and int(match.group(1)) >= first_fresh else old

    combine = jax.jit(lambda a, b: jax.tree_util.tree_map_with_path(pick, a, b),
                      out_shardings=shardings)
    return combine(loaded, fresh)


def freeze_encoder(optimizer: optax.GradientTransformation) -> optax.GradientTransformation:
    """`optimizer`, then zero updates for `encoder/...` (so weight decay leaves it alone too).

    Zeroing after the whole chain keeps the optimizer state shaped like the parameters (its
    encoder moments stay zero: the model stops the gradient), which the sharded state needs;
    optax.multi_transform would replace them with MaskedNodes.
    """

    def update(updates, state, params=None):
        del params
        return {**updates, "encoder": jax.tree.map(jnp.zeros_like, updates["encoder"])}, state

    zero_encoder = optax.GradientTransformation(lambda _: optax.EmptyState(), update)
    return optax.chain(optimizer, zero_encoder)


def save_tokenizer(tokenizer: Tokenizer, workdir: str) -> str:
    """The run's own copy of its vocabulary (what run.json's tokenizer_dir names)."""
    directory = os.path.join(workdir, "tokenizer")
    if not os.path.isdir(directory):
        staging = directory + ".tmp"
        tokenizer.save(staging)
        os.replace(staging, directory)
    return os.path.abspath(directory)
