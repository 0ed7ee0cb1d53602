"""Using a trained encoder from Python: `bertjax.load(path)` -> Model.

    import bertjax
    model = bertjax.load("runs/base")              # workdir, params export or Hugging Face BERT dir
    vecs = model.embed(["a sentence", "another"], pooling="mean", normalize=True)   # [2, H]
    model.similarity(["a cat"], ["a dog", "a car"])                              # [1, 2] cosines
    model.fill_mask("paris is the [MASK] of france.", top_k=5)
    states = model.encode(["a sentence"], layers="all")[0].hidden                # [L+1, T, H]
    model.predict(["a great film"])                 # a fine-tuned run: its own head and labels

Loading goes through `bertjax.inference.loading` (the loader fine-tuning, export and predict
use); a fine-tuned run's `predict` through `bertjax.inference.prediction` (what predict mode
runs). Inputs are run in length buckets (`bertjax.core.length_buckets`) by functions jitted once
per bucket shape, on one device or, given a mesh, with the parameters laid out by the same rules
as training.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from typing import Any, Sequence

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax

from bertjax.core import library_logs
from bertjax.core.errors import UserError
from bertjax.core.length_buckets import Row, run_bucketed
from bertjax.data.schema import INPUTS
from bertjax.finetune.examples import QAExample, SpanExample, TaggedExample, TextExample
from bertjax.finetune.features import assemble, truncate_pair
from bertjax.finetune.readers import check_span
from bertjax.finetune.tasks import TaskSettings, task_class
from bertjax.inference import loading, standardizing
from bertjax.inference.prediction import predict_examples, trained_settings
from bertjax.model import pooling as poolings
from bertjax.model.config import EncoderConfig
from bertjax.model.encoder import Encoder, gather_positions
from bertjax.model.heads import MaskedLmHead
from bertjax.parallel import partitioning
from bertjax.parallel.mesh import make_mesh
from bertjax.train.state import abstract_train_state

Layers = str | int | Sequence[int]  # "all", one index (negative from the end), or indices


@dataclasses.dataclass
class Encoded:
    tokens: list[str]      # [CLS] ... [SEP] (... [SEP]), as the model saw them
    ids: np.ndarray        # [T]
    hidden: np.ndarray     # [len(layers), T, H] fp32; index 0 of "all" is the embedding output


class _EncoderWithLayers(nn.Module):
    config: EncoderConfig

    @nn.compact
    def __call__(self, batch, *, deterministic: bool = True):
        out = Encoder(self.config, all_layers=True, name="encoder")(
            batch["input_ids"], batch["segment_ids"], batch["input_mask"],
            deterministic=deterministic)
        return out.layers


class _MaskFiller(nn.Module):
    """The encoder and the pretrained MLM head, at the [MASK] positions only."""

    config: EncoderConfig

    @nn.compact
    def __call__(self, batch, *, deterministic: bool = True):
        encoder = Encoder(self.config, name="encoder")
        out = encoder(batch["input_ids"], batch["segment_ids"], batch["input_mask"],
                      deterministic=deterministic)
        hidden = gather_positions(out.sequence, batch["masked_positions"])
        return MaskedLmHead(self.config, name="mlm")(hidden, encoder.attend)


class Model:
    """A loaded encoder, ready to run. Build it with `bertjax.load`."""

    def __init__(self, loaded: loading.Loaded, *, batch_size: int = 32,
                 max_seq_len: int | None = None, mesh=None, dtype: str | None = None):
        config = loaded.require_encoder()
        self.loaded = loaded
        self.config = dataclasses.replace(config, remat="none",
                                          **({"dtype": dtype} if dtype else {}))
        limit = config.max_position_embeddings
        self.max_seq_len = limit if max_seq_len is None else min(max_seq_len, limit)
        if self.max_seq_len < 3:
            raise UserError(f"max_seq_len must be at least 3, got {max_seq_len}")
        if batch_size < 1:
            raise UserError(f"batch_size must be positive, got {batch_size}")
        self.batch_size = batch_size
        self.mesh = mesh if mesh is not None else make_mesh(1, 1, 1, devices=jax.devices()[:1])
        self.tokenizer = loaded.tokenizer()
        if self.tokenizer.vocab_size != config.vocab_size:
            raise UserError(f"the tokenizer of {loaded.path} has {self.tokenizer.vocab_size} "
                            f"entries, the model's embedding table {config.vocab_size}")
        self.truncated = 0  # texts cut to max_seq_len so far (also reported on stderr)
        self._compiled: dict[Any, Any] = {}
        self._placed: dict[str, Any] = {}

    # ---- public API -----------------------------------------------------------------------

    @property
    def path(self) -> str:
        return self.loaded.path

    @property
    def num_layers(self) -> int:
        return self.config.num_layers

    def encode(self, texts: Sequence[str], pairs: Sequence[str] | None = None,
               layers: Layers = "all") -> list[Encoded]:
        """Per-token hidden states of the chosen layers, one `Encoded` per text."""
        chosen = self.layer_indices(layers)
        rows = self._rows(texts, pairs)
        fn = self._encoder_fn(("encode", chosen), lambda states, mask: states[jnp.array(chosen)])
        outputs = self._run(fn, rows)
        return [Encoded(self.tokenizer.tokens(ids), ids,
                        out[:, :len(ids)].astype(np.float32))
                for (ids, _), out in zip(rows, outputs)]

    def embed(self, texts: Sequence[str], pooling: str = "mean", *, layers: Layers = "all",
              normalize: bool = False, pairs: Sequence[str] | None = None,
              standardize=None) -> np.ndarray:
        """One vector per text [N, H] (fp32): `pooling` over the tokens of the chosen layers;
        with `standardize` (statistics from `bertjax.embed --fit-standardizer`, or their path),
        transformed by them before `normalize`."""
        pooling_name = _checked_pooling(pooling)
        chosen = self.layer_indices(layers)
        stats = standardizing.resolve(standardize)
        if stats is not None:
            standardizing.check_fits(self, stats, standardizing.SENTENCES, chosen, pooling_name)
            raw = self.embed(texts, pooling_name, layers=chosen, pairs=pairs)
            return standardizing.standardized(raw, stats, normalize)

        def pooled(states, mask):
            vectors = poolings.pool(states[jnp.array(chosen)], mask, pooling_name)
            return poolings.normalized(vectors) if normalize else vectors

        fn = self._encoder_fn(("embed", chosen, pooling_name, normalize), pooled)
        rows = self._rows(texts, pairs)
        if not rows:
            return np.zeros((0, self.config.hidden_size), np.float32)
        return np.stack(self._run(fn, rows)).astype(np.float32)

    def similarity(self, a: Sequence[str], b: Sequence[str], pooling: str = "mean", *,
                   standardize=None) -> np.ndarray:
        """Cosine similarity of the pooled embeddings (standardised first with `standardize`),
        [len(a), len(b)]."""
        stats = standardizing.resolve(standardize)
        left = self.embed(a, pooling, normalize=True, standardize=stats)
        right = self.embed(b, pooling, normalize=True, standardize=stats)
        return left @ right.T

    def word_vectors(self, sentences: Sequence[Sequence[str]], layers: Layers = -1,
                     standardize=None) -> list[np.ndarray]:
        """Contextual word embeddings: per sentence (a list of words) [words, H], each word the
        mean of its subwords' states averaged over the chosen layers (then transformed by the
        `standardize` statistics, fitted for word vectors). Words past max_seq_len get NaN rows
        (counted in `truncated`)."""
        chosen = self.layer_indices(layers)
        stats = standardizing.resolve(standardize)
        if stats is not None:
            standardizing.check_fits(self, stats, standardizing.WORDS, chosen)
            return [standardizing.standardized(v, stats, False)
                    for v in self.word_vectors(sentences, chosen)]
        rows, spans = [], []
        unk = self.tokenizer.special.unk
        pieces = iter(self.tokenizer.encode_batch([w for s in sentences for w in s]))
        for words in sentences:
            ids, word_spans = [self.tokenizer.special.cls], []
            for _ in words:
                sub = next(pieces).tolist() or [unk]
                if len(ids) + len(sub) > self.max_seq_len - 1:
                    word_spans.append(None)
                    continue
                word_spans.append((len(ids), len(ids) + len(sub)))
                ids += sub
            ids.append(self.tokenizer.special.sep)
            cut = sum(span is None for span in word_spans)
            self.truncated += bool(cut)
            rows.append((np.asarray(ids, np.int32), np.zeros(len(ids), np.int32)))
            spans.append(word_spans)
        fn = self._encoder_fn(("words", chosen), lambda states, mask: jnp.mean(
            states[jnp.array(chosen)].astype(jnp.float32), axis=0))
        outputs = self._run(fn, rows)
        vectors = []
        for out, word_spans in zip(outputs, spans):
            rows_out = np.full((len(word_spans), self.config.hidden_size), np.nan, np.float32)
            for i, span in enumerate(word_spans):
                if span is not None:
                    rows_out[i] = out[span[0]:span[1]].mean(axis=0)
            vectors.append(rows_out)
        return vectors

    def fill_mask(self, text: str | Sequence[str], top_k: int = 5) -> list:
        """The pretrained MLM head's top_k (token, probability) for each [MASK] in `text` (or, for a
        list of texts, one such list per text)."""
        fresh = [part for part in self.loaded.record.get("initialized", []) if "MLM" in part]
        if "mlm" not in (self.loaded.params or {}) or fresh:
            raise UserError(f"{self.path} has no pretrained MLM head (a fine-tuned run or an "
                            "encoder-only import); fill_mask needs one")
        if top_k < 1:
            raise UserError(f"top_k must be positive, got {top_k}")
        texts = [text] if isinstance(text, str) else list(text)
        rows = [self._masked_row(t) for t in texts]
        mask_id = self.tokenizer.special.mask
        positions = [np.flatnonzero(ids == mask_id) for ids, _ in rows]
        for t, found in zip(texts, positions):
            if not len(found):
                raise UserError(f"no [MASK] in {t[:60]!r}")
        slots = max(len(p) for p in positions)
        k = min(top_k, self.config.vocab_size)
        params = self._params("fill_mask", _MaskFiller(self.config), ("encoder", "mlm"),
                              {"masked_positions": (slots, np.int32)})

        def fill(batch):
            logits = _MaskFiller(self.config).apply({"params": params}, batch)
            probs, ids = jax.lax.top_k(jax.nn.softmax(logits, axis=-1), k)
            return {"probs": probs, "ids": ids}

        jitted = self._compiled.setdefault(("fill_mask", slots, k), jax.jit(fill))
        results = []
        for (ids, segments), found in zip(rows, positions):
            batch = {"input_ids": ids[None], "segment_ids": segments[None],
                     "input_mask": np.ones((1, len(ids)), np.int32),
                     "masked_positions": np.pad(found, (0, slots - len(found)))[None]
                     .astype(np.int32)}
            out = jax.device_get(jitted(batch))
            results.append([[(self.tokenizer.id_to_token(int(t)), float(p))
                             for t, p in zip(out["ids"][0, m], out["probs"][0, m])]
                            for m in range(len(found))])
        return results[0] if isinstance(text, str) else results

    def predict(self, texts: Sequence, pairs: Sequence[str] | None = None):
        """A fine-tuned run's predictions with its own head, labels and settings: classification
        {"label", "probabilities"}, regression {"score"}, token classification {"words", "tags"}
        (texts are split on whitespace), span classification: texts are (text, start, end)
        character spans, {"label", "probabilities"} each; QA: texts are questions, pairs their
        contexts, and the answers come back as {id: text}."""
        task = str(self.loaded.record.get("task", ""))
        if not task.startswith("finetune"):
            raise UserError(f"{self.path} is not a fine-tuned run (its task is "
                            f"{task or 'not recorded'}); predict needs a task head")
        kind = task_class(task).kind
        if pairs is not None and len(pairs) != len(texts):
            raise UserError(f"{len(texts)} texts but {len(pairs)} pairs")
        if kind == "qa":
            if pairs is None:
                raise UserError("QA predictions need the contexts: predict(questions, pairs=...)")
            examples = [QAExample(id=str(i), question=q, context=c, answers=[])
                        for i, (q, c) in enumerate(zip(texts, pairs))]
        elif kind == "span":
            examples = [_span_example(i, t) for i, t in enumerate(texts)]
        elif kind == "tagged":
            examples = [TaggedExample(str(i), t.split() if isinstance(t, str) else list(t))
                        for i, t in enumerate(texts)]
        else:
            examples = [TextExample(str(i), t, pairs[i] if pairs is not None else None)
                        for i, t in enumerate(texts)]
        settings = trained_settings(TaskSettings(), self.loaded.record)
        return predict_examples(self.loaded, settings, examples, "the texts given", self.mesh,
                                self._mesh_rows(self.batch_size), report=False)

    # ---- machinery ---------------------------------------------------------------------------

    def layer_indices(self, layers: Layers) -> tuple[int, ...]:
        count = self.config.num_layers + 1
        if isinstance(layers, str):
            if layers != "all":
                raise UserError(f"layers={layers!r}: give 'all', an index or a list of indices")
            return tuple(range(count))
        chosen = [layers] if isinstance(layers, (int, np.integer)) else list(layers)
        if not chosen:
            raise UserError("layers: choose at least one layer")
        resolved = []
        for index in chosen:
            if not -count <= int(index) < count:
                raise UserError(f"layer {index} does not exist: the model has {count} hidden "
                                f"states (0 = embeddings .. {count - 1} = last layer)")
            resolved.append(int(index) % count)
        return tuple(resolved)

    def _rows(self, texts: Sequence[str], pairs: Sequence[str] | None) -> list[Row]:
        if isinstance(texts, str):
            raise UserError("give a list of texts, not one string")
        if pairs is not None and len(pairs) != len(texts):
            raise UserError(f"{len(texts)} texts but {len(pairs)} pairs")
        firsts = self.tokenizer.encode_batch(list(texts))
        seconds = self.tokenizer.encode_batch(list(pairs)) if pairs is not None else None
        budget = self.max_seq_len - (3 if seconds is not None else 2)
        rows, cut_count = [], 0
        for i, first in enumerate(firsts):
            a, b, cut = truncate_pair(first, seconds[i] if seconds is not None else None, budget)
            cut_count += cut
            ids, segments = assemble(self.tokenizer, a, b)
            rows.append((np.asarray(ids, np.int32), np.asarray(segments, np.int32)))
        if cut_count:
            self.truncated += cut_count
            print(f"note: {cut_count} text(s) truncated to {self.max_seq_len} tokens",
                  file=sys.stderr)
        return rows

    def _masked_row(self, text: str) -> Row:
        """[CLS] text [SEP] with each literal "[MASK]" as the mask token (the tokenizer would
        split it into "[", "mask", "]")."""
        special = self.tokenizer.special
        pieces = self.tokenizer.encode_batch(text.split("[MASK]"))
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
        """jit(batch -> head(hidden states [L+1, B, T, H], mask [B, T])), cached by `key`."""
        if key not in self._compiled:
            module = _EncoderWithLayers(self.config)
            params = self._params("encoder", module, ("encoder",))
            mesh = self.mesh

            def fn(batch):
                with partitioning.axis_rules(mesh):
                    states = module.apply({"params": params}, batch)
                out = head(states, batch["input_mask"])
                return jnp.moveaxis(out, 0, 1) if out.ndim == 4 else out  # rows first

            self._compiled[key] = jax.jit(fn)
        return self._compiled[key]

    def _run(self, fn, rows: list[Row]) -> list:
        if not rows:
            return []

        def placed(batch):
            return fn(partitioning.global_batch(batch, self.mesh))

        return run_bucketed(placed, rows, batch_size=self._mesh_rows(self.batch_size),
                            limit=self.max_seq_len, pad_id=self.tokenizer.special.pad,
                            min_rows=partitioning.batch_shards(self.mesh))


def _span_example(index: int, given) -> SpanExample:
    try:
        text, start, end = given
    except (TypeError, ValueError):
        raise UserError(f"span {index}: give (text, start, end), got {given!r}") from None
    if not isinstance(text, str) or not all(isinstance(x, (int, np.integer)) for x in (start, end)):
        raise UserError(f"span {index}: give (text, start, end) with integer offsets, got "
                        f"{given!r}")
    check_span(text, int(start), int(end), f"span {index}")
    return SpanExample(str(index), text, int(start), int(end))


def _checked_pooling(name: str) -> str:
    if name not in poolings.POOLINGS:
        raise UserError(f"unknown pooling {name!r}; choose one of {', '.join(poolings.POOLINGS)}")
    return name


def load(path: str, *, step: int | None = None, batch_size: int = 32,
         max_seq_len: int | None = None, mesh=None, dtype: str | None = None,
         base: str | None = None) -> Model:
    """A model from a pretraining or fine-tuning workdir (latest checkpoint, or `step`; a
    fine-tuning run's best), a params export, an adapters export (on `base`, by default the base
    it records), or a Hugging Face BERT directory (converted in memory: nothing is written)."""
    library_logs.quiet_routine_library_logs()
    loaded = loading.load(path, _best_step(path) if step is None else step, base=base)
    return Model(loaded, batch_size=batch_size, max_seq_len=max_seq_len, mesh=mesh, dtype=dtype)


def _best_step(path: str) -> int | None:
    """A finished fine-tuning run is used at its best dev checkpoint (results.json)."""
    if loading.kind_of(path) != loading.WORKDIR:
        return None
    results = loading.read_json(os.path.join(path, loading.RESULTS_FILE))
    return results.get("best_step") if results.get("finished") else None
