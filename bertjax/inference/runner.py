"""How the Python API runs a loaded encoder: texts to token rows, parameters placed on the mesh
once, functions jitted once per head and bucket shape, rows run in length buckets.

`Runner` is the machinery under `bertjax.inference.api.Model`; its arguments are checked there.
"""

from __future__ import annotations

import dataclasses
import functools
import sys
from typing import Any

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax.core.errors import UserError
from bertjax.core.length_buckets import Row, run_bucketed
from bertjax.data.schema import INPUTS
from bertjax.finetune.features import assemble, truncate_pair
from bertjax.inference import loading
from bertjax.inference.arguments import MASK
from bertjax.model.config import EncoderConfig
from bertjax.model.encoder import Encoder
from bertjax.model.primitives import gather_positions
from bertjax.model.heads import BertForPretraining, MaskedLmHead
from bertjax.parallel import partitioning
from bertjax.parallel.mesh import make_mesh
from bertjax.train.state import abstract_train_state


class EncoderWithLayers(nn.Module):
    """The encoder's hidden states of every layer, [L+1, B, T, H] (0 = the embeddings' output)."""

    config: EncoderConfig

    @nn.compact
    def __call__(self, batch, *, deterministic: bool = True):
        out = Encoder(self.config, all_layers=True, name="encoder")(
            batch["input_ids"], batch["segment_ids"], batch["input_mask"],
            deterministic=deterministic)
        return out.layers


class MaskFiller(nn.Module):
    """The encoder and the pretrained MLM head, at the [MASK] positions only."""

    config: EncoderConfig

    @nn.compact
    def __call__(self, batch, *, deterministic: bool = True):
        encoder = Encoder(self.config, name="encoder")
        out = encoder(batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                      deterministic=deterministic)
        hidden = gather_positions(out.sequence, batch["masked_positions"])
        return MaskedLmHead(self.config, name="mlm")(hidden, encoder.attend)


class DecodedMaskFiller(BertForPretraining):
    """MaskFiller of a model pretrained with DeBERTa's enhanced mask decoder: the MLM head reads
    the decoder, as in pretraining (parameters `encoder`, `mlm`, `emd`)."""

    def __call__(self, batch, *, deterministic: bool = True):
        return super().__call__(batch, deterministic=deterministic)["mlm_logits"]


class Runner:
    """A loaded encoder on a mesh, with its tokenizer, compiled functions and placed parameters."""

    def __init__(self, loaded: loading.Loaded, *, batch_size: int, max_seq_len: int | None,
                 mesh, dtype: str | None):
        config = loaded.require_encoder()
        self.loaded = loaded
        self.config = dataclasses.replace(config, remat="none",
                                          **({"dtype": dtype} if dtype else {}))
        limit = config.max_sequence_length
        self.max_seq_len = limit if max_seq_len is None else min(max_seq_len, limit)
        self.batch_size = int(batch_size)  # numpy's integers are accepted
        self.mesh = mesh if mesh is not None else make_mesh(1, 1, 1, devices=jax.devices()[:1])
        if not loaded.has_tokenizer:  # loaded.tokenizer()'s advice names the jobs' options
            raise UserError(f"{loaded.path} keeps no tokenizer, which a loaded model needs to "
                            "read text: export it with its vocabulary (`python -m bertjax.export "
                            f"--workdir {loaded.path} --format params --tokenizer VOCAB --output "
                            "DIR`) and use DIR")
        self.tokenizer = loaded.tokenizer()
        if self.tokenizer.vocab_size != config.vocab_size:
            raise UserError(f"the tokenizer of {loaded.path} has {self.tokenizer.vocab_size} "
                            f"entries, the model's embedding table {config.vocab_size}")
        self.truncated = 0  # texts cut to max_seq_len so far (also reported on stderr)
        self._compiled: dict[Any, Any] = {}
        self._placed: dict[str, Any] = {}

    def _rows(self, texts: list[str], pairs: list[str] | None) -> list[Row]:
        firsts = self.tokenizer.encode_batch(texts)
        seconds = self.tokenizer.encode_batch(pairs) if pairs is not None else None
        budget = self.max_seq_len - (3 if seconds is not None else 2)
        rows, cut_count = [], 0
        for i, first in enumerate(firsts):
            a, b, cut = truncate_pair(first, seconds[i] if seconds is not None else None, budget)
            cut_count += cut
            ids, segments = assemble(self.tokenizer, a, b)
            rows.append((np.asarray(ids, np.int32), np.asarray(segments, np.int32)))
        self._note_truncated(cut_count, f"text(s) truncated to {self.max_seq_len} tokens")
        return rows

    def _note_truncated(self, count: int, what: str) -> None:
        if count:
            self.truncated += count
            print(f"note: {count} {what}", file=sys.stderr)

    def _masked_row(self, text: str) -> Row:
        """[CLS] text [SEP] with each literal "[MASK]" as the mask token (the tokenizer would
        split it into "[", "mask", "]")."""
        special = self.tokenizer.special
        pieces = self.tokenizer.encode_batch(text.split(MASK))
        ids = [special.cls]
        for i, piece in enumerate(pieces):
            ids += ([special.mask] if i else []) + piece.tolist()
        ids = ids[:self.max_seq_len - 1] + [special.sep]
        return np.asarray(ids, np.int32), np.zeros(len(ids), np.int32)

    def _mesh_rows(self, rows: int) -> int:
        shards = partitioning.batch_shards(self.mesh)
        return -(-rows // shards) * shards

    def _params(self, name: str, module: nn.Module, subtrees: tuple[str, ...],
                extra: dict | None = None):
        if name not in self._placed:
            shapes = {key: jax.ShapeDtypeStruct((self._mesh_rows(1), 8), field.dtype)
                      for key, field in INPUTS.items()}
            for key, (width, dtype) in (extra or {}).items():
                shapes[key] = jax.ShapeDtypeStruct((self._mesh_rows(1), width), dtype)
            _, shardings = abstract_train_state(module, optax.identity(), shapes, self.mesh)
            params = {key: self.loaded.params[key] for key in subtrees}
            self._placed[name] = jax.device_put(params, shardings.params)
        return self._placed[name]

    def _encoder_fn(self, key, head):
        """batch -> head(hidden states [L+1, B, T, H], mask [B, T]), jitted once per `key`.

        The placed parameters are an argument of the jitted function, not constants closed over:
        as constants they were copied into every compiled program (a 180 MB HLO for MiniLM, each
        pooling and bucket compiling and caching its own copy of the weights)."""
        if key not in self._compiled:
            module = EncoderWithLayers(self.config)
            mesh = self.mesh

            def fn(params, batch):
                with partitioning.axis_rules(mesh):
                    states = module.apply({"params": params}, batch)
                out = head(states, batch["input_mask"])
                return jnp.moveaxis(out, 0, 1) if out.ndim == 4 else out  # rows first

            self._compiled[key] = functools.partial(
                jax.jit(fn), self._params("encoder", module, ("encoder",)))
        return self._compiled[key]

    def _mask_filler_fn(self, slots: int, top_k: int):
        """batch -> the top_k {"probs", "ids"} at each row's first `slots` [MASK]s (jitted; the
        parameters an argument, as in _encoder_fn). The positions are found on the device, so
        that texts of any length share their length bucket's program: one compile per bucket,
        not one per distinct length."""
        key = ("fill_mask", slots, top_k)
        if key not in self._compiled:
            passes = self.loaded.heads.get("enhanced_mask_decoder", 0)
            module = (DecodedMaskFiller(self.config, nsp=False, enhanced_mask_decoder=passes)
                      if passes else MaskFiller(self.config))
            mask_id = self.tokenizer.special.mask

            def fill(params, batch):
                # A stable sort puts the [MASK]s first, in order; the positions after a row's
                # own masks are other tokens, whose predictions the caller drops.
                not_mask = (batch["input_ids"] != mask_id).astype(jnp.int32)
                positions = jnp.argsort(not_mask, axis=-1, stable=True)[:, :slots]
                logits = module.apply({"params": params},
                                      {**batch, "masked_positions": positions.astype(jnp.int32)})
                probs, ids = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), top_k)
                return {"probs": probs, "ids": ids}

            params = self._params("fill_mask", module,
                                  ("encoder", "mlm", "emd") if passes else ("encoder", "mlm"),
                                  {"masked_positions": (slots, np.int32)})
            self._compiled[key] = functools.partial(jax.jit(fill), params)
        return self._compiled[key]

    def _filled(self, fn, rows: list[Row], counts: list[int]) -> list:
        """Per row, per [MASK] (the first `counts[i]` of row i): the top (token, probability)
        pairs; the rows run together in length buckets."""
        outputs = self._run(fn, rows)
        return [[[(self.tokenizer.id_to_token(int(t)), float(p))
                  for t, p in zip(out["ids"][m], out["probs"][m])] for m in range(count)]
                for out, count in zip(outputs, counts)]

    def _run(self, fn, rows: list[Row]) -> list:
        if not rows:
            return []

        def placed(batch):
            return fn(partitioning.global_batch(batch, self.mesh))

        return run_bucketed(placed, rows, batch_size=self._mesh_rows(self.batch_size),
                            limit=self.max_seq_len, pad_id=self.tokenizer.special.pad,
                            min_rows=partitioning.batch_shards(self.mesh))
