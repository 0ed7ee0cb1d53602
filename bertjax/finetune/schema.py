"""The fine-tuning batch, declared once: each task's keys, their shapes and dtypes.

The counterpart of `bertjax.data.schema` (the pretraining batch, whose `Field`, encoder `INPUTS`
and axis names it shares). A task's features are conformed to its declaration as they are built
(`Task.featurize`), and every abstract batch a fine-tuning step is initialized or compiled with
is made from conformed features (`abstract_batch`), so a key added or retyped here is added or
retyped everywhere. Axes: `batch` rows; `seq_len` tokens (data.max_seq_len; the axis length
buckets cut); `query_len` and `document_len` a retrieval query's and document's tokens
(data.max_query_length, data.max_seq_len; never cut); `num_labels` a teacher's classes;
`pack_slots` the sequences a packed training row can hold (`bertjax.finetune.packing`).
"""

from __future__ import annotations

from typing import Mapping

import jax
import numpy as np

from bertjax.data.schema import BATCH, INPUTS, SEQ_LEN, Field

QUERY_LEN, DOCUMENT_LEN, NUM_LABELS = "query_len", "document_len", "num_labels"
PACK_SLOTS = "pack_slots"

WEIGHT = {"weight": Field((BATCH,), np.float32, "1 for a real row, 0 for a placeholder that "
                                                "completes a batch (or a row not trained on)")}
CLASS_LABEL = {"label": Field((BATCH,), np.int32, "the label id (0 for prediction input)")}
SCORE_LABEL = {"label": Field((BATCH,), np.float32, "the regression target")}
CLOZE_MASK = {"mask_position": Field((BATCH,), np.int32, "the position of the template's [MASK]")}
TAGS = {
    "label_ids": Field((BATCH, SEQ_LEN), np.int32, "each position's tag id"),
    "label_mask": Field((BATCH, SEQ_LEN), np.int32, "1 where a position's tag is trained on"),
}
ANSWER = {
    "context_mask": Field((BATCH, SEQ_LEN), np.int32, "1 on the context window's tokens"),
    "start_positions": Field((BATCH,), np.int32, "the answer's first token (0 when unknown)"),
    "end_positions": Field((BATCH,), np.int32, "the answer's last token (0 when unknown)"),
}
SPAN = {
    "span_start": Field((BATCH,), np.int32, "the span's first token"),
    "span_end": Field((BATCH,), np.int32, "the span's last token (inclusive)"),
}


def _texts(side: str, axis: str, keyed: bool) -> dict[str, Field]:
    """A retrieval side's rows: [CLS] text [SEP] padded, its mask and (documents) its key."""
    fields = {f"{side}_ids": Field((BATCH, axis), np.int32, f"[CLS] {side} [SEP], padded"),
              f"{side}_mask": Field((BATCH, axis), np.int32, "1 for real tokens")}
    if keyed:
        fields[f"{side}_key"] = Field((BATCH,), np.int32, "the text's CRC-32: equal texts are "
                                                          "one document of the batch")
    return fields


QUERIES = _texts("query", QUERY_LEN, keyed=False)
DOCUMENTS = _texts("document", DOCUMENT_LEN, keyed=True)
NEGATIVES = _texts("negative", DOCUMENT_LEN, keyed=True)  # training with hard negatives

# Distillation adds the teacher's logits to the training rows (`bertjax.jobs.distill`).
TEACHER_LOGITS = "teacher_logits"
TEACHER = {TEACHER_LOGITS: Field((BATCH, NUM_LABELS), np.float32, "the teacher head's logits")}
TOKEN_TEACHER = {TEACHER_LOGITS: Field((BATCH, SEQ_LEN, NUM_LABELS), np.float32,
                                       "the teacher head's logits at every position")}

# Each task's batch.
CLASSIFICATION = {**INPUTS, **CLASS_LABEL, **WEIGHT}
CLOZE = {**INPUTS, **CLOZE_MASK, **CLASS_LABEL, **WEIGHT}
REGRESSION = {**INPUTS, **SCORE_LABEL, **WEIGHT}
TOKEN_CLASSIFICATION = {**INPUTS, **TAGS, **WEIGHT}
QUESTION_ANSWERING = {**INPUTS, **ANSWER, **WEIGHT}
SPAN_CLASSIFICATION = {**INPUTS, **SPAN, **CLASS_LABEL, **WEIGHT}
RETRIEVAL = {**QUERIES, **DOCUMENTS, **WEIGHT}

# Packed training rows (train.packing): several sequences a row, each label per sequence slot.
PACKING = {
    "positions": Field((BATCH, SEQ_LEN), np.int32, "each token's position in its own sequence"),
    "pack_ids": Field((BATCH, SEQ_LEN), np.int32, "the token's sequence, 1 up (0: padding)"),
    "starts": Field((BATCH, PACK_SLOTS), np.int32, "each sequence's [CLS] position"),
    "weight": Field((BATCH, PACK_SLOTS), np.float32, "1 for a sequence, 0 for an empty slot"),
}
PACKED_CLASSIFICATION = {**INPUTS, **PACKING, "label": Field(
    (BATCH, PACK_SLOTS), np.int32, "each sequence's label id")}
PACKED_REGRESSION = {**INPUTS, **PACKING, "label": Field(
    (BATCH, PACK_SLOTS), np.float32, "each sequence's regression target")}

# The arrays a batch's length bucket cuts (`length_bucketing`): those along seq_len.
TOKEN_KEYS = tuple(dict.fromkeys(
    key for batch in (CLASSIFICATION, CLOZE, REGRESSION, TOKEN_CLASSIFICATION,
                      QUESTION_ANSWERING, SPAN_CLASSIFICATION, RETRIEVAL)
    for key, field in batch.items() if field.axes[1:2] == (SEQ_LEN,)))


def conform(arrays: Mapping[str, np.ndarray], declared: Mapping[str, Field],
            optional: Mapping[str, Field] | None = None) -> dict[str, np.ndarray]:
    """`arrays` (in their order) cast to the declared dtypes, once their keys and shapes are
    checked against `declared` (every key) and `optional` (keys that may be there): a producer
    that drifts from the declaration fails here rather than in a compiled step."""
    allowed = {**declared, **(optional or {})}
    missing, extra = set(declared) - set(arrays), set(arrays) - set(allowed)
    if missing or extra:
        raise AssertionError(f"the features lack {sorted(missing)} and have {sorted(extra)} "
                             "beyond the schema")
    sizes: dict[str, int] = {}
    for key, value in arrays.items():
        axes = allowed[key].axes
        if np.ndim(value) != len(axes):
            raise AssertionError(f"features[{key!r}] has shape {np.shape(value)}, the schema "
                                 f"says axes {axes}")
        for axis, size in zip(axes, np.shape(value)):
            if sizes.setdefault(axis, size) != size:
                raise AssertionError(f"features[{key!r}] has {size} along {axis}, other "
                                     f"arrays {sizes[axis]}")
    return {key: np.asarray(value).astype(allowed[key].dtype, copy=False)
            for key, value in arrays.items()}


def abstract_batch(arrays: Mapping[str, np.ndarray], batch_size: int,
                   sharding=None) -> dict[str, jax.ShapeDtypeStruct]:
    """A batch of `batch_size` rows of these (conformed) features, as abstract global arrays:
    what a fine-tuning model is initialized and its steps compiled with."""
    return {key: jax.ShapeDtypeStruct((batch_size, *np.shape(value)[1:]), value.dtype,
                                      sharding=sharding) for key, value in arrays.items()}
