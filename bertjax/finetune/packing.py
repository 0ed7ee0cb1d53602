"""Training rows packed with several sentences (pairs) each, instead of one padded sentence a row.

A fine-tuning epoch of short sentences padded to max_seq_len is mostly padding. With
`train.packing` every training row of max_seq_len tokens holds as many whole sequences as fit,
each keeping its own [CLS] ... [SEP] tokens and segment ids; `positions` restart at 0 for each
and `pack_ids` (1, 2, ... ; 0 on padding) keep the encoder's attention inside each sequence, so a
sequence's outputs are those it has alone (within fp32 rounding). Per sequence slot a row carries
`starts` (its [CLS] position), `label` and `weight` (0 for an empty slot); the head pools each
slot's [CLS] (SequenceClassifier), and the loss averages over weighted slots as the unpacked loss
averages over weighted rows. Only training packs: evaluation and prediction read unpacked rows.

The packing is first-fit decreasing over the whole epoch: sequences longest first, each into the
first row with room. Sequences of equal length are interchangeable to it, so the number of rows
depends only on the lengths and every epoch has the same steps (a static schedule; a resumed run
sees the batches of an uninterrupted one). Randomness stays: ties between equal lengths are broken
by the epoch's permutation (which sentences share a row changes every epoch), and the rows are
shuffled before they are batched. A row holds at most `slots` sequences: max_seq_len // the
shortest training sequence, so the cap never stops a sequence from fitting; the slot axis costs
a gather and the classifier per slot, nothing next to the encoder.
"""

from __future__ import annotations

import math
from typing import Iterator, Mapping

import numpy as np

from bertjax.core.errors import UserError
from bertjax.data.schema import Field
from bertjax.finetune import length_bucketing
from bertjax.finetune.batches import EpochBatches
from bertjax.finetune.features import Arrays
from bertjax.finetune.schema import conform

TOKEN_ARRAYS = ("input_ids", "segment_ids")


def first_fit_decreasing(order: np.ndarray, lengths: np.ndarray, capacity: int,
                         slots: int) -> list[np.ndarray]:
    """Rows of sequence indices: `order`'s sequences, longest first (ties in `order`'s order),
    each put in the first row with `lengths` room and fewer than `slots` sequences."""
    ranked = order[np.argsort(-lengths[order], kind="stable")]
    room = np.full(len(order) + 1, -1, np.int64)  # -1: a full row (or one not opened yet)
    count = np.zeros(len(order) + 1, np.int64)
    rows: list[list[int]] = []
    for index in ranked:
        need = lengths[index]
        fits = room[:len(rows) + 1] >= need
        row = int(np.argmax(fits)) if fits.any() else len(rows)
        if row == len(rows):
            rows.append([])
            room[row] = capacity
        rows[row].append(int(index))
        room[row] -= need
        count[row] += 1
        if count[row] == slots:
            room[row] = -1
    return [np.asarray(r, np.int64) for r in rows]


def pack(arrays: Arrays, lengths: np.ndarray, rows: list[np.ndarray], length: int,
         slots: int) -> Arrays:
    """Packed arrays of `rows` (lists of sequence indices, each sequence `lengths` tokens; an
    empty list is an empty row)."""
    count = len(rows)
    out = {key: np.zeros((count, length), np.int32)
           for key in (*TOKEN_ARRAYS, "input_mask", "positions", "pack_ids")}
    out["starts"] = np.zeros((count, slots), np.int32)
    out["label"] = np.zeros((count, slots), arrays["label"].dtype)
    out["weight"] = np.zeros((count, slots), np.float32)
    for r, members in enumerate(rows):
        at = 0
        for slot, index in enumerate(members):
            n = int(lengths[index])
            for key in TOKEN_ARRAYS:
                out[key][r, at:at + n] = arrays[key][index, :n]
            out["input_mask"][r, at:at + n] = 1
            out["positions"][r, at:at + n] = np.arange(n)
            out["pack_ids"][r, at:at + n] = slot + 1
            out["starts"][r, slot] = at
            out["label"][r, slot] = arrays["label"][index]
            out["weight"][r, slot] = arrays["weight"][index]
            at += n
    return out


class PackedBatches:
    """EpochBatches' interface (batch(step), iterate, steps_per_epoch, no length buckets) over
    packed rows; `batch_size` counts packed rows."""

    buckets: tuple[int, ...] = ()

    def __init__(self, arrays: Arrays, batch_size: int, seed: int, max_seq_len: int,
                 declared: Mapping[str, Field], *, process_index: int = 0,
                 process_count: int = 1):
        if batch_size % process_count:
            raise UserError(f"train.batch_size {batch_size} does not split over {process_count} "
                            "processes")
        self.arrays, self.batch_size, self.seed = arrays, batch_size, seed
        self.max_seq_len, self.declared = max_seq_len, declared
        self.sequences = len(arrays["weight"])
        self.lengths = length_bucketing.row_lengths(arrays)
        self.slots = max(1, max_seq_len // max(int(self.lengths.min()), 1))
        self._plan: tuple[int, list] | None = None
        self.rows_per_epoch = len(self.epoch_rows(0))
        self.steps_per_epoch = math.ceil(self.rows_per_epoch / batch_size)
        local = batch_size // process_count
        self._local = slice(process_index * local, (process_index + 1) * local)
        # One row's arrays: what the step is initialized and compiled with (abstract_batch).
        self.template = self._packed([np.arange(1)])

    def epoch_rows(self, epoch: int) -> list[np.ndarray]:
        """Every packed row of `epoch` (sequence indices), in the order they are batched."""
        if self._plan is None or self._plan[0] != epoch:
            order = np.random.default_rng([self.seed, epoch]).permutation(self.sequences)
            rows = first_fit_decreasing(order, self.lengths, self.max_seq_len, self.slots)
            shuffled = np.random.default_rng([self.seed, epoch, 1]).permutation(len(rows))
            self._plan = (epoch, [rows[i] for i in shuffled])
        return self._plan[1]

    def global_rows(self, step: int) -> list[np.ndarray]:
        """The packed rows of step `step` + 1's global batch; the epoch's last batch is
        completed with empty rows."""
        epoch, index = divmod(step, self.steps_per_epoch)
        rows = self.epoch_rows(epoch)
        if epoch and len(rows) != self.rows_per_epoch:  # the count depends only on the lengths
            raise AssertionError(f"epoch {epoch} packed {len(rows)} rows, epoch 0 "
                                 f"{self.rows_per_epoch}")
        batch = rows[index * self.batch_size:(index + 1) * self.batch_size]
        return batch + [np.zeros(0, np.int64)] * (self.batch_size - len(batch))

    def batch(self, step: int) -> Arrays:
        rows = self.global_rows(step)[self._local]
        return self._packed(rows)

    def _packed(self, rows: list[np.ndarray]) -> Arrays:
        return conform(pack(self.arrays, self.lengths, rows, self.max_seq_len, self.slots),
                       self.declared)

    def iterate(self, start_step: int) -> Iterator[Arrays]:
        step = start_step
        while True:
            yield self.batch(step)
            step += 1

    def length(self, step: int) -> None:
        return None

    def length_bound(self) -> None:
        return None

    def padding(self, buckets: tuple[int, ...]) -> dict[str, float]:
        """The fraction of the first epoch's training tokens that are padding: packed, one
        sequence a row padded to max_seq_len, and (with more than one bucket) length-bucketed;
        placeholder rows completing the last batch count as padding."""
        real = int(self.lengths.sum())
        unpacked_rows = math.ceil(self.sequences / self.batch_size) * self.batch_size
        fractions = {
            "packed": 1 - real / (self.steps_per_epoch * self.batch_size * self.max_seq_len),
            "padded_to_max_seq_len": 1 - real / (unpacked_rows * self.max_seq_len)}
        if len(buckets) > 1:
            per_real, _ = EpochBatches(self.arrays, self.batch_size, self.seed,
                                       buckets=buckets).padding()
            fractions["length_buckets"] = per_real / (1 + per_real)
        return {key: round(value, 4) for key, value in fractions.items()}
