"""Whole-word and span selection (BERT whole-word masking, SpanBERT span masking), the part of
`masking.Masker` that works in words; see masking.py's docstring for the references followed.

`WordSelection` is a base of Masker: it reads Masker's `config`, `_word_start` and `_span_cdf`.
"""

from __future__ import annotations

import bisect
from typing import NamedTuple

import numpy as np


class Spans(NamedTuple):
    """The spans chosen for one example, in the order they were drawn."""
    first: np.ndarray        # int[S] position of each span's first token
    end: np.ndarray          # int[S] position just past each span's last token
    words: np.ndarray        # int[S] words the span covers
    drawn_words: np.ndarray  # int[S] length drawn from the law (only the last span may be cut)


class _Words(NamedTuple):
    first: np.ndarray         # int[W] first token of each word
    end: np.ndarray           # int[W] one past its last token
    of_token: np.ndarray      # int[L] word index of each token (meaningful at candidates only)
    ends_segment: np.ndarray  # bool[W] the token after the word is special or the sequence end


class WordSelection:
    """Masker's choice of whole words and spans."""

    def _words(self, ids: np.ndarray, cand: np.ndarray) -> _Words:
        # A word starts at a word-start token, or at any token that follows a special token.
        follows_special = np.ones_like(cand)
        follows_special[1:] = ~cand[:-1]
        starts = cand & (self._word_start[ids] | follows_special)
        first = np.flatnonzero(starts)
        stops = np.append(np.flatnonzero(starts | ~cand), ids.size)
        end = stops[np.searchsorted(stops, first, side="right")]
        ends_segment = ~np.append(cand, False)[end]
        return _Words(first, end, np.cumsum(starts) - 1, ends_segment)

    def _whole_word_positions(self, ids, cand, budget, rng) -> np.ndarray:
        words = self._words(ids, cand)
        order = rng.permutation(words.first.size)
        sizes = (words.end - words.first)[order]
        taken = np.zeros(order.size, bool)
        pos, left = 0, budget
        # Google's loop over the shuffled words, a run of words at a time: take the longest
        # prefix that fits, skip the word that overflows, go on from the next word that fits.
        while left > 0:
            fits = np.flatnonzero(sizes[pos:] <= left)
            if fits.size == 0:
                break
            pos += int(fits[0])
            total = np.cumsum(sizes[pos:])
            count = int(np.searchsorted(total, left, side="right"))
            taken[pos:pos + count] = True
            left -= int(total[count - 1])
            pos += count + 1
        chosen = np.zeros(order.size, bool)
        chosen[order[taken]] = True
        return np.flatnonzero(cand & chosen[words.of_token])

    def _choose_spans(self, ids, cand, budget, max_predictions, rng) -> Spans:
        words = self._words(ids, cand)
        index = np.arange(words.first.size)
        # next_stop[w]: the first word from w on that a span starting at w may not cover (a used
        # word, or the first word past w's segment); next_stop - index is the room at w.
        next_stop = np.minimum.accumulate(
            np.where(words.ends_segment, index + 1, index.size)[::-1])[::-1]
        spans, drawn, left = [], [], budget
        while left > 0:
            length = self._span_length(rng, self.config.max_span_length)
            starts = np.flatnonzero(next_stop - index >= length)
            if starts.size == 0:
                # Redraw from the law restricted to the lengths that still fit: the same as
                # drawing until one fits, without the loop.
                longest = int((next_stop - index).max(initial=0))
                if longest == 0:
                    break
                length = self._span_length(rng, longest)
                starts = np.flatnonzero(next_stop - index >= length)
            start = int(starts[int(rng.random() * starts.size)])
            count = length
            if words.end[start + length - 1] - words.first[start] > left:
                covered = np.cumsum(words.end[start:start + length]
                                    - words.first[start:start + length])
                count = _cut_last_span(covered, left, budget - left, max_predictions, rng)
            if count:
                end = start + count
                # Keep an unmasked token on both sides of every span (SpanBERT merges touching
                # spans instead), so that span_left / span_right always point at visible tokens.
                low = start - (start > 0 and not words.ends_segment[start - 1])
                high = end + (not words.ends_segment[end - 1])
                next_stop[low:high] = index[low:high]
                next_stop[np.searchsorted(next_stop[:low], low, side="right"):low] = low
                spans.append((words.first[start], words.end[end - 1], count))
                drawn.append(length)
                left -= int(words.end[end - 1] - words.first[start])
            if count < length:
                break
        table = np.array(spans, np.int64).reshape(-1, 3)
        return Spans(table[:, 0], table[:, 1], table[:, 2], np.array(drawn, np.int64))

    def _span_length(self, rng: np.random.Generator, longest: int) -> int:
        """A length in words from the law restricted to 1..longest (inverse cdf)."""
        top = min(longest, self.config.max_span_length)
        length = 1 + bisect.bisect_right(self._span_cdf, rng.random() * self._span_cdf[top - 1])
        return min(length, top)  # guards float rounding at the top of the cdf


def _cut_last_span(covered: np.ndarray, left: int, used: int, max_predictions: int,
                   rng: np.random.Generator) -> int:
    """Words of an overflowing span to keep: those within the budget, plus the word the budget
    ends inside with probability (budget left in it) / (its size), so that the expected total
    is exactly the budget; never more than max_predictions."""
    count = int(np.searchsorted(covered, left, side="right"))
    before = int(covered[count - 1]) if count else 0
    size = int(covered[count]) - before
    if used + before + size <= max_predictions and rng.random() * size < left - before:
        count += 1
    return count
