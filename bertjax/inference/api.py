"""Using a trained encoder from Python: `bertjax.load(path)` -> Model.

    import bertjax
    model = bertjax.load("runs/base")              # workdir, params export or Hugging Face BERT dir
    vecs = model.embed(["a sentence", "another"], pooling="mean", normalize=True)   # [2, H]
    model.similarity(["a cat"], ["a dog", "a car"])                              # [1, 2] cosines
    model.fill_mask("paris is the [MASK] of france.", top_k=5)
    states = model.encode(["a sentence"], layers="all")[0].hidden                # [L+1, T, H]
    model.predict(["a great film"])                 # a fine-tuned run: its own head and labels

Every argument is checked before anything is read or run (`bertjax.inference.arguments`): a wrong
type raises a TypeError, a bad value a UserError (a ValueError), naming the argument. Lists of
texts (texts, pairs, a, b, sentences) must be lists: a lone string is refused; an empty list gives
an empty result. Loading goes through `bertjax.inference.loading` (the loader fine-tuning, export
and predict use); a fine-tuned run's `predict` through `bertjax.inference.prediction` (what
predict mode runs); the running through `bertjax.inference.runner`: inputs in length buckets,
by functions jitted once per bucket shape, on one device or, given a mesh, with the parameters
laid out by the same rules as training.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Sequence

import jax.numpy as jnp
import numpy as np

from bertjax.core import library_logs
from bertjax.core.errors import UserError
from bertjax.finetune.tasks import TaskSettings, task_class
from bertjax.inference import arguments, loading, standardizing
from bertjax.inference.arguments import MASK
from bertjax.inference.prediction import predict_examples, trained_settings
from bertjax.inference.runner import Runner
from bertjax.model import pooling as poolings

Layers = str | int | Sequence[int]  # "all", one index (negative from the end), or indices


@dataclasses.dataclass
class Encoded:
    tokens: list[str]      # [CLS] ... [SEP] (... [SEP]), as the model saw them
    ids: np.ndarray        # [T]
    hidden: np.ndarray     # [len(layers), T, H] fp32; index 0 of "all" is the embedding output


class Model(Runner):
    """A loaded encoder, ready to run. Build it with `bertjax.load`."""

    def __init__(self, loaded: loading.Loaded, *, batch_size: int = 32,
                 max_seq_len: int | None = None, mesh=None, dtype: str | None = None):
        arguments.model_options("Model", batch_size, max_seq_len, mesh, dtype)
        super().__init__(loaded, batch_size=batch_size, max_seq_len=max_seq_len, mesh=mesh,
                         dtype=dtype)

    @property
    def path(self) -> str:
        return self.loaded.path

    @property
    def num_layers(self) -> int:
        return self.config.num_layers

    def layer_indices(self, layers: Layers, where: str = "layers") -> tuple[int, ...]:
        """`layers` ('all', an index or indices, negative from the end) as hidden-state indices."""
        return arguments.layer_indices(where, layers, self.config.num_layers)

    def encode(self, texts: Sequence[str], pairs: Sequence[str] | None = None,
               layers: Layers = "all") -> list[Encoded]:
        """Per-token hidden states of the chosen layers, one `Encoded` per text of the list
        `texts` (a lone string is refused; `pairs`, if given, one second text per text)."""
        texts = arguments.texts("encode", texts)
        pairs = arguments.pairs("encode", pairs, len(texts))
        chosen = self.layer_indices(layers, "encode")
        rows = self._rows(texts, pairs)
        fn = self._encoder_fn(("encode", chosen), lambda states, mask: states[jnp.array(chosen)])
        outputs = self._run(fn, rows)
        return [Encoded(self.tokenizer.tokens(ids), ids,
                        out[:, :len(ids)].astype(np.float32))
                for (ids, _), out in zip(rows, outputs)]

    def embed(self, texts: Sequence[str], pooling: str = "mean", *, layers: Layers = "all",
              normalize: bool = False, pairs: Sequence[str] | None = None,
              standardize=None) -> np.ndarray:
        """One vector per text of the list `texts` [N, H] (fp32; [0, H] for no texts; a lone
        string is refused): `pooling` over the tokens of the chosen layers; with `standardize`
        (statistics from `bertjax.embed --fit-standardizer`, or their path), transformed by them
        before `normalize`."""
        texts = arguments.texts("embed", texts)
        pairs = arguments.pairs("embed", pairs, len(texts))
        pooling_name = arguments.pooling("embed", pooling)
        chosen = self.layer_indices(layers, "embed")
        normalize = arguments.flag("embed", "normalize", normalize)
        stats = standardizing.resolve(arguments.standardize("embed", standardize))
        if stats is not None:
            standardizing.check_fits(self, stats, standardizing.SENTENCES, chosen, pooling_name)
            raw = self.embed(texts, pooling_name, layers=chosen, pairs=pairs)
            return standardizing.standardized(raw, stats, normalize)
        if not texts:
            return np.zeros((0, self.config.hidden_size), np.float32)

        def pooled(states, mask):
            vectors = poolings.pool(states[jnp.array(chosen)], mask, pooling_name)
            return poolings.normalized(vectors) if normalize else vectors

        fn = self._encoder_fn(("embed", chosen, pooling_name, normalize), pooled)
        return np.stack(self._run(fn, self._rows(texts, pairs))).astype(np.float32)

    def similarity(self, a: Sequence[str], b: Sequence[str], pooling: str = "mean", *,
                   standardize=None) -> np.ndarray:
        """Cosine similarity of the pooled embeddings (standardised first with `standardize`) of
        two lists of texts, [len(a), len(b)]."""
        a = arguments.texts("similarity", a, "a")
        b = arguments.texts("similarity", b, "b")
        arguments.pooling("similarity", pooling)
        stats = standardizing.resolve(arguments.standardize("similarity", standardize))
        left = self.embed(a, pooling, normalize=True, standardize=stats)
        right = self.embed(b, pooling, normalize=True, standardize=stats)
        return left @ right.T

    def word_vectors(self, sentences: Sequence[Sequence[str]], layers: Layers = -1,
                     standardize=None) -> list[np.ndarray]:
        """Contextual word embeddings: per sentence, a list of words (a sentence given as one
        string is refused, not split), [words, H], each word the mean of its subwords' states
        averaged over the chosen layers (then transformed by the `standardize` statistics,
        fitted for word vectors). Words past max_seq_len get NaN rows (counted in `truncated`)."""
        sentences = arguments.sentences("word_vectors", sentences)
        chosen = self.layer_indices(layers, "word_vectors")
        stats = standardizing.resolve(arguments.standardize("word_vectors", standardize))
        if stats is not None:
            standardizing.check_fits(self, stats, standardizing.WORDS, chosen)
            return [standardizing.standardized(v, stats, False)
                    for v in self.word_vectors(sentences, chosen)]
        rows, spans = self._word_rows(sentences)
        fn = self._encoder_fn(("words", chosen), lambda states, mask: jnp.mean(
            states[jnp.array(chosen)].astype(jnp.float32), axis=0))
        vectors = []
        for out, word_spans in zip(self._run(fn, rows), spans):
            rows_out = np.full((len(word_spans), self.config.hidden_size), np.nan, np.float32)
            for i, span in enumerate(word_spans):
                if span is not None:
                    rows_out[i] = out[span[0]:span[1]].mean(axis=0)
            vectors.append(rows_out)
        return vectors

    def fill_mask(self, text: str | Sequence[str], top_k: int = 5) -> list:
        """The pretrained MLM head's top_k (token, probability) for each [MASK] in `text`, one
        text (the one parameter that takes a lone string); for a list of texts, one such list per
        text. A [MASK] past max_seq_len gets an empty list, and its text counts in `truncated`."""
        texts = arguments.masked_texts("fill_mask", text)
        top_k = arguments.integer("fill_mask", "top_k", top_k, 1)
        fresh = [part for part in self.loaded.record.get("initialized", []) if "MLM" in part]
        if "mlm" not in (self.loaded.params or {}) or fresh:
            raise UserError(f"{self.path} has no pretrained MLM head (a fine-tuned run or an "
                            "encoder-only import); fill_mask needs one")
        if not texts:
            return []
        rows = [self._masked_row(t) for t in texts]
        positions = [np.flatnonzero(ids == self.tokenizer.special.mask) for ids, _ in rows]
        dropped = [t.count(MASK) - len(found) for t, found in zip(texts, positions)]
        self._note_truncated(sum(map(bool, dropped)), f"text(s) cut to {self.max_seq_len} tokens: "
                             f"their {sum(dropped)} [MASK](s) past it get no predictions")
        slots = max([len(found) for found in positions] + [1])
        fn = self._mask_filler_fn(slots, min(top_k, self.config.vocab_size))
        masked = [i for i, found in enumerate(positions) if len(found)]
        filled = dict(zip(masked, self._filled(fn, [rows[i] for i in masked],
                                               [len(positions[i]) for i in masked])))
        results = [filled.get(i, []) + [[]] * cut for i, cut in enumerate(dropped)]
        return results[0] if isinstance(text, str) else results

    def predict(self, texts: Sequence, pairs: Sequence[str] | None = None):
        """A fine-tuned run's predictions with its own head, labels and settings, for a list of
        inputs (a lone string is refused; an empty list gives an empty result): classification
        {"label", "probabilities"}, regression {"score"}, token classification {"words", "tags"}
        (texts split on whitespace, or lists of words), span classification: texts are
        (text, start, end) character spans, {"label", "probabilities"} each; QA: texts are
        questions, pairs their contexts, and the answers come back as {id: text}."""
        task = str(self.loaded.record.get("task", ""))
        if not task.startswith("finetune"):
            raise UserError(f"{self.path} is not a fine-tuned run (its task is "
                            f"{task or 'not recorded'}); predict needs a task head")
        kind = task_class(task).kind
        examples = arguments.task_examples("predict", kind, texts, pairs)
        if not examples:
            return {} if kind == "qa" else []
        settings = trained_settings(TaskSettings(), self.loaded.record)
        return predict_examples(self.loaded, settings, examples, "the texts given", self.mesh,
                                self._mesh_rows(self.batch_size), report=False)

    def _word_rows(self, sentences: list[list[str]]):
        """Token rows of the sentences, and per word its [start, end) tokens (None when past
        max_seq_len)."""
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
            self.truncated += any(span is None for span in word_spans)
            rows.append((np.asarray(ids, np.int32), np.zeros(len(ids), np.int32)))
            spans.append(word_spans)
        return rows, spans


def load(path: str, *, step: int | None = None, batch_size: int = 32,
         max_seq_len: int | None = None, mesh=None, dtype: str | None = None,
         base: str | None = None) -> Model:
    """A model from a pretraining or fine-tuning workdir (latest checkpoint, or `step`; a
    fine-tuning run's best), a params export, an adapters export (on `base`, by default the base
    it records), or a Hugging Face BERT directory (converted in memory: nothing is written).
    Every argument is checked before anything is read."""
    path = arguments.path("load", "path", path)
    step = arguments.integer("load", "step", step, 0, optional=True)
    base = arguments.path("load", "base", base, optional=True)
    arguments.model_options("load", batch_size, max_seq_len, mesh, dtype)
    library_logs.quiet_routine_library_logs()
    if step is None:  # a model on a bucket: its records read from this host's copy
        local = loading.fetched(path)
        with loading.named_errors(path, local):
            step = _best_step(local)
    loaded = loading.load(path, step, base=base)  # fetches the checkpoint of `step`
    return Model(loaded, batch_size=batch_size, max_seq_len=max_seq_len, mesh=mesh, dtype=dtype)


def _best_step(path: str) -> int | None:
    """A finished fine-tuning run is used at its best dev checkpoint (results.json)."""
    if loading.kind_of(path) != loading.WORKDIR:
        return None
    results = loading.read_json(os.path.join(path, loading.RESULTS_FILE))
    return results.get("best_step") if results.get("finished") else None
