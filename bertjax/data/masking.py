"""Masked-LM masking: BERT token and whole-word masking, SpanBERT span masking.

Masks are drawn afresh for every example at every step (RoBERTa's dynamic masking), on the host,
with one `np.random.Generator` per example: an example's masking depends only on its ids, the
prediction budget and that generator's state, whether it is masked alone or in a batch. The work
is vectorized numpy: token masking over the whole batch, whole-word and span selection per example
(span masking: a few numpy calls per span), never a Python loop over tokens.

References followed:
- BERT, google-research/bert `create_pretraining_data.py` (`create_masked_lm_predictions`): the
  budget `min(max_predictions, max(1, round(n * mask_prob)))`; whole words taken in shuffled order,
  a word that would overflow the budget skipped; the 80/10/10 choice made per token, also for
  whole words. We count only non-special tokens in `n` (Google counts [CLS]/[SEP] too), start a
  new word at a "##" piece right after a special token (Google's loop would glue it to the word
  before the [SEP]), and draw random replacements from the non-special vocabulary (Google's may
  draw a special token).
- SpanBERT (Joshi et al., 2020), facebookresearch/SpanBERT `pretraining/fairseq/data/masking.py`
  (`PairWithSpanMaskingScheme`, `span_masking`): span lengths in words from Geometric(p) restricted
  to 1..max_span_length and renormalized (mean 3.80 words at p=0.2, the paper's figure; the same as
  redrawing lengths above the maximum, whereas min(length, max) would give 4.46); spans added until
  the token budget is met, the last one cut to it; the 80/10/10 choice made per span, random
  tokens drawn per token. Unlike SpanBERT, spans never overlap or touch (it merges such spans):
  each keeps an unmasked token on both sides, so span_left / span_right are always visible. A
  length is drawn first, then a start uniformly among the words where it fits; only if it fits
  nowhere is it redrawn from the law restricted to the room left.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import numpy as np

from bertjax.data import schema
from bertjax.data.masking_config import MaskingConfig, is_int
from bertjax.data.word_selection import Spans, WordSelection
from bertjax.core.errors import UserError


class _Selection(NamedTuple):
    """One example's predictions before corruption, padded to max_predictions slots."""
    positions: np.ndarray    # int[P] sorted; unused slots hold 0
    count: int               # used slots
    unit: np.ndarray         # int[P] slot -> index of its 80/10/10 draw (token or span)
    span_fields: tuple       # (left, right, offset) int[P] each, or () when not span masking


class Masker(WordSelection):
    """Chooses the tokens an example predicts and corrupts its input; see the module docstring."""

    def __init__(self, config: MaskingConfig, *, vocab_size: int, mask_id: int,
                 special_ids: np.ndarray, word_start: np.ndarray,
                 unigram_counts: np.ndarray | None = None):
        if not isinstance(config, MaskingConfig):
            raise TypeError(f"Masker needs a MaskingConfig, got {type(config).__name__}")
        if not is_int(vocab_size) or vocab_size < 2:
            raise UserError(f"vocab_size must be an integer of at least 2, got {vocab_size!r}")
        special_ids = np.asarray(special_ids).reshape(-1)
        if special_ids.size and (special_ids.dtype.kind not in "iu" or special_ids.min() < 0
                                 or special_ids.max() >= vocab_size):
            raise UserError(f"special_ids must be integer ids below vocab_size {vocab_size}")
        if not is_int(mask_id) or not 0 <= mask_id < vocab_size:
            raise UserError(f"mask_id {mask_id!r} is outside the vocabulary of {vocab_size}")
        word_start = np.asarray(word_start)
        if word_start.shape != (vocab_size,) or word_start.dtype != bool:
            raise UserError(f"word_start must be bool[{vocab_size}], "
                            f"got {word_start.dtype}{list(word_start.shape)}")
        self.config = config
        self.vocab_size = int(vocab_size)
        self.mask_id = int(mask_id)
        # [MASK] is never a prediction target nor a random replacement, listed or not.
        self._special = np.zeros(vocab_size, bool)
        self._special[special_ids] = True
        self._special[mask_id] = True
        self._word_start = word_start
        self._ordinary_ids = np.flatnonzero(~self._special)
        if self._ordinary_ids.size == 0:
            raise UserError("the vocabulary has no non-special token to predict")
        self._unigram_cdf = None
        if config.random_token_source == "unigram":
            self._unigram_cdf = self._cumulative_counts(unigram_counts)
        self._span_cdf = np.cumsum(config.span_length_pmf()).tolist()  # for bisect

    def _cumulative_counts(self, counts: np.ndarray | None) -> np.ndarray:
        if counts is None:
            raise UserError("masking.random_token_source='unigram' needs unigram_counts "
                            "(token frequencies of the corpus)")
        counts = np.asarray(counts, np.float64)
        if counts.shape != (self.vocab_size,) or not np.all(np.isfinite(counts)) \
                or np.any(counts < 0):
            raise UserError(f"unigram_counts must be {self.vocab_size} finite non-negative counts")
        counts = np.where(self._special, 0.0, counts)  # [UNK] has corpus counts: never draw it
        if counts.sum() <= 0:
            raise UserError("unigram_counts are zero for every non-special token")
        self._last_drawable = int(np.flatnonzero(counts)[-1])
        return np.cumsum(counts)

    # ---- public API --------------------------------------------------------------------------

    def __call__(self, input_ids: np.ndarray, max_predictions: int,
                 rng: np.random.Generator) -> dict[str, np.ndarray]:
        """Masks one laid-out example ([CLS] A [SEP] B [SEP] [PAD]...).

        Returns "input_ids" int32[L] (masked copy), "masked_positions", "masked_ids" (original ids)
        int32[P], "masked_weights" float32[P] (1 real, 0 padding), P = max_predictions, sorted by
        position, padding entries 0; strategy "span" adds "span_left", "span_right" (positions
        just outside the token's span) and "span_offset" (its 0-based offset inside it), int32[P].
        """
        ids = np.asarray(input_ids)
        if ids.ndim != 1:
            raise UserError(f"input_ids must be 1-D (one example), got shape {list(ids.shape)}")
        batch = self.mask_batch(ids[None], max_predictions, [rng])
        return {key: value[0] for key, value in batch.items()}

    def mask_batch(self, input_ids: np.ndarray, max_predictions: int,
                   rngs: Sequence[np.random.Generator]) -> dict[str, np.ndarray]:
        """Row i masked with rngs[i] exactly as `__call__` masks it; outputs stacked to [B, ...].
        Token masking vectorizes over the batch: several times faster than row by row."""
        ids, cand, budget = self._prepare(input_ids, max_predictions, rngs)
        batch, length = ids.shape
        if self.config.strategy == "token":
            # One draw per example: sort keys for the positions, then the 80/10/10 and the
            # replacement draws, so that selection vectorizes over the batch.
            draws = np.stack([rng.random(length + 2 * max_predictions) for rng in rngs])
            positions = self._token_positions(cand, budget, draws[:, :length], max_predictions)
            return self._corrupt(ids, positions, budget, draws[:, length:-max_predictions],
                                 draws[:, -max_predictions:], ())
        chosen = [self._select(row, row_cand, int(row_budget), max_predictions, rng)
                  for row, row_cand, row_budget, rng in zip(ids, cand, budget, rngs)]
        draws = np.stack([rng.random(2 * max_predictions) for rng in rngs])
        # The 80/10/10 draw of a slot is that of its unit: its own (whole_word), its span's.
        unit = np.stack([c.unit for c in chosen])
        return self._corrupt(ids, np.stack([c.positions for c in chosen]),
                             np.array([c.count for c in chosen]),
                             draws[np.arange(batch)[:, None], unit], draws[:, max_predictions:],
                             tuple(np.stack(f) for f in zip(*(c.span_fields for c in chosen))))

    def choose_spans(self, input_ids: np.ndarray, max_predictions: int,
                     rng: np.random.Generator) -> Spans:
        """The spans `__call__` with strategy "span" masks for this generator state."""
        ids, cand, budget = self._prepare(np.asarray(input_ids)[None], max_predictions, [rng])
        return self._choose_spans(ids[0], cand[0], int(budget[0]), max_predictions, rng)

    def random_tokens(self, uniforms: np.ndarray) -> np.ndarray:
        """Replacement ids from U[0, 1) draws: uniform over the non-special vocabulary, or by
        unigram counts (specials excluded either way)."""
        if self._unigram_cdf is None:
            index = (uniforms * self._ordinary_ids.size).astype(np.int64)
            return self._ordinary_ids[np.minimum(index, self._ordinary_ids.size - 1)]
        picked = np.searchsorted(self._unigram_cdf, uniforms * self._unigram_cdf[-1], "right")
        return np.minimum(picked, self._last_drawable)

    # ---- selection ---------------------------------------------------------------------------

    def _prepare(self, input_ids, max_predictions,
                 rngs) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Validated ids [B, L], candidate mask (non-special) and BERT's budget per row."""
        ids = np.asarray(input_ids)
        if ids.ndim != 2 or ids.dtype.kind not in "iu" or ids.shape[0] == 0:
            raise UserError(f"input_ids must be a non-empty [B, L] integer array, "
                            f"got {ids.dtype}{list(ids.shape)}")
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            raise UserError(f"input_ids hold ids outside the vocabulary of {self.vocab_size}")
        if not is_int(max_predictions) or max_predictions < 1:
            raise UserError(f"max_predictions must be a positive integer, got {max_predictions!r}")
        if len(rngs) != ids.shape[0] or not all(isinstance(r, np.random.Generator) for r in rngs):
            raise UserError(f"need one numpy Generator per example: {ids.shape[0]} examples, "
                            f"{len(rngs)} generators")
        cand = ~self._special[ids]
        if self.config.strategy == "span" and ids.shape[1] and np.any(cand[:, 0] | cand[:, -1]):
            raise UserError("span masking needs every segment bounded by special tokens "
                            "([CLS] first, [SEP] or [PAD] last)")
        n = cand.sum(axis=1)
        # np.rint rounds half to even, as Python 3's round() in Google's code does.
        wanted = np.maximum(1, np.rint(n * self.config.mask_prob).astype(np.int64))
        return ids, cand, np.minimum(np.minimum(wanted, n), max_predictions)

    @staticmethod
    def _token_positions(cand, budget, keys, max_predictions) -> np.ndarray:
        """The `budget` candidates with the smallest uniform keys: a uniform sample without
        replacement. Positions [B, P], sorted, 0 in unused slots."""
        length = cand.shape[1]
        order = np.argsort(np.where(cand, keys, 2.0), axis=1)[:, :max_predictions]
        positions = np.full((cand.shape[0], max_predictions), length)
        used = np.arange(order.shape[1]) < budget[:, None]
        positions[:, :order.shape[1]] = np.where(used, order, length)
        positions.sort(axis=1)
        positions[positions == length] = 0
        return positions

    def _select(self, ids, cand, budget, max_predictions, rng) -> _Selection:
        if self.config.strategy == "whole_word":
            positions = self._whole_word_positions(ids, cand, budget, rng)
            # Google draws 80/10/10 per token, also under whole-word masking.
            return _pad_selection(positions, np.arange(positions.size), (), max_predictions)
        spans = self._choose_spans(ids, cand, budget, max_predictions, rng)
        order = np.argsort(spans.first)
        first, end = spans.first[order], spans.end[order]
        sizes = end - first
        unit = np.repeat(np.arange(sizes.size), sizes)
        offset = np.arange(unit.size) - np.repeat(np.cumsum(sizes) - sizes, sizes)
        return _pad_selection(first[unit] + offset, unit, (first[unit] - 1, end[unit], offset),
                              max_predictions)

    # ---- corruption --------------------------------------------------------------------------

    def _corrupt(self, ids, positions, count, draw, replacement_draws, span_fields) -> dict:
        """Applies 80/10/10 by each slot's draw and packs the outputs, for all rows at once.
        `positions` and `span_fields` already hold 0 in unused slots."""
        rows = np.arange(ids.shape[0])[:, None]
        real = np.arange(positions.shape[1]) < count[:, None]
        config = self.config
        replaced = np.where(draw < config.mask_token_prob, self.mask_id,
                            self.random_tokens(replacement_draws))
        change = real & (draw < config.mask_token_prob + config.random_token_prob)
        masked = ids.copy()
        changed_rows, changed_slots = np.nonzero(change)
        masked[changed_rows, positions[changed_rows, changed_slots]] = replaced[change]
        return schema.with_declared_dtypes({
            "input_ids": masked, "masked_positions": positions,
            "masked_ids": np.where(real, ids[rows, positions], 0), "masked_weights": real,
            **dict(zip(schema.SPAN_FIELDS, span_fields))})


def _pad_selection(positions, unit, span_fields, max_predictions) -> _Selection:
    def pad(values):
        padded = np.zeros(max_predictions, np.int64)
        padded[:values.size] = values
        return padded
    return _Selection(pad(positions), positions.size, pad(unit), tuple(map(pad, span_fields)))
