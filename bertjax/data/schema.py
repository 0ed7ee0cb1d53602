"""The pretraining batch, declared once: its keys, their shapes and dtypes.

Producers (the masker, the batch builder, the benchmark's synthetic batch) build to this
declaration and consumers (the job's abstract batch for compilation, model initialization) read
it, so that a key added or retyped here is added or retyped everywhere. Shapes are named by axis:
`batch` rows, `seq_len` tokens, `max_predictions` prediction slots a row.
"""

from __future__ import annotations

import dataclasses
from typing import Mapping

import numpy as np

BATCH, SEQ_LEN, PREDICTIONS = "batch", "seq_len", "max_predictions"


@dataclasses.dataclass(frozen=True)
class Field:
    axes: tuple[str, ...]
    dtype: type
    meaning: str


# What the encoder reads.
INPUTS = {
    "input_ids": Field((BATCH, SEQ_LEN), np.int32, "token ids, masked ones corrupted"),
    "segment_ids": Field((BATCH, SEQ_LEN), np.int32, "0 for segment A, 1 for segment B"),
    "input_mask": Field((BATCH, SEQ_LEN), np.int32, "1 for real tokens, 0 for padding"),
}
# Masked-LM targets, sorted by position; unused slots hold 0 everywhere.
MLM_TARGETS = {
    "masked_positions": Field((BATCH, PREDICTIONS), np.int32, "position of each prediction"),
    "masked_ids": Field((BATCH, PREDICTIONS), np.int32, "original id at that position"),
    "masked_weights": Field((BATCH, PREDICTIONS), np.float32, "1 for a real slot, 0 unused"),
}
# Next-sentence prediction (example mode "nsp").
NSP_FIELDS = {
    "nsp_label": Field((BATCH,), np.int32, "0: B follows A, 1: B is random"),
}
# Span masking (SpanBERT's span boundary objective).
SPAN_FIELDS = {
    "span_left": Field((BATCH, PREDICTIONS), np.int32, "position just before the slot's span"),
    "span_right": Field((BATCH, PREDICTIONS), np.int32, "position just after the slot's span"),
    "span_offset": Field((BATCH, PREDICTIONS), np.int32, "0-based offset inside the span"),
}


# Packed documents kept apart (example mode "documents"): what the encoder reads beside INPUTS.
PACKING_FIELDS = {
    "pack_ids": Field((BATCH, SEQ_LEN), np.int32, "1, 2, .. the document a token belongs to; "
                                                  "0 for padding"),
    "positions": Field((BATCH, SEQ_LEN), np.int32, "a token's position inside its document"),
}


def fields(*, nsp: bool, span: bool, packed: bool = False) -> dict[str, Field]:
    """The keys of a batch with (or without) next-sentence labels, span and packing fields."""
    return {**INPUTS, **MLM_TARGETS, **(NSP_FIELDS if nsp else {}),
            **(SPAN_FIELDS if span else {}), **(PACKING_FIELDS if packed else {})}


def pretraining_batch_spec(batch_size: int, seq_len: int, max_predictions: int, *, nsp: bool,
                           span: bool, packed: bool = False
                           ) -> dict[str, tuple[tuple[int, ...], np.dtype]]:
    """key -> (shape, dtype) of a batch of `batch_size` rows."""
    sizes = {BATCH: batch_size, SEQ_LEN: seq_len, PREDICTIONS: max_predictions}
    return {key: (tuple(sizes[axis] for axis in field.axes), np.dtype(field.dtype))
            for key, field in fields(nsp=nsp, span=span, packed=packed).items()}


def zeros_batch(batch_size: int, seq_len: int, max_predictions: int, *, nsp: bool,
                span: bool) -> dict[str, np.ndarray]:
    """A batch of zeros of the declared shapes, e.g. to initialize a model."""
    spec = pretraining_batch_spec(batch_size, seq_len, max_predictions, nsp=nsp, span=span)
    return {key: np.zeros(shape, dtype) for key, (shape, dtype) in spec.items()}


def with_declared_dtypes(arrays: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """`arrays` (some of a batch's keys) cast to the dtypes declared for them."""
    declared = fields(nsp=True, span=True, packed=True)
    return {key: np.asarray(value).astype(declared[key].dtype, copy=False)
            for key, value in arrays.items()}


def conform(batch: Mapping[str, np.ndarray], batch_size: int, seq_len: int,
            max_predictions: int, *, nsp: bool, span: bool,
            packed: bool = False) -> dict[str, np.ndarray]:
    """`batch` cast to the declared dtypes, once its keys and shapes are checked against the
    declaration: a producer that drifts from it fails here rather than in a compiled step."""
    spec = pretraining_batch_spec(batch_size, seq_len, max_predictions, nsp=nsp, span=span,
                                  packed=packed)
    if set(batch) != set(spec):
        raise AssertionError(f"the batch lacks {sorted(set(spec) - set(batch))} and has "
                             f"{sorted(set(batch) - set(spec))} beyond the schema")
    for key, (shape, _) in spec.items():
        if np.shape(batch[key]) != shape:
            raise AssertionError(f"batch[{key!r}] has shape {np.shape(batch[key])}, "
                                 f"the schema says {shape}")
    return with_declared_dtypes(batch)
