"""Dual-encoder retrieval: (query, positive[, hard negative]) rows, in-batch negatives.

Training scores every query of a batch against every document of the batch (all positives, then
all hard negatives when data.negative_column is set) by cosine / finetune.temperature, and takes
the cross-entropy of its own positive (`objectives.in_batch`). Queries are rows of
data.max_query_length tokens, documents of data.max_seq_len ([CLS] and [SEP] included); longer
texts are cut and counted.

Evaluation is exact search on the device (`retrieval.exact`: cosine matmul + top-k): each distinct
dev query against every distinct dev positive, MRR@10 (the main metric), Recall@1, Recall@10 and
nDCG@10 (`retrieval.metrics`); a query's relevant documents are the positives of all its rows.
Predictions score each (query, document) pair by cosine.
"""

from __future__ import annotations

import collections
import zlib
from typing import Sequence

import numpy as np

from bertjax.core.errors import UserError
from bertjax.finetune import objectives, schema
from bertjax.finetune.features import Features, assemble
from bertjax.finetune.examples import TextExample
from bertjax.finetune.tasks.base import Outputs, Task, TaskSettings
from bertjax.model.dual_encoder import DualEncoder, encoder_names
from bertjax.retrieval import exact
from bertjax.retrieval import metrics as ranking

SEARCH_DEPTH = 10
_PLURALS = {"query": "queries", "document": "documents", "negative": "hard negatives"}


def text_key(text: str) -> int:
    """A document's identity in a batch (equal texts are one document), as an int32."""
    return int(np.uint32(zlib.crc32(text.encode("utf-8"))).view(np.int32))


class Retrieval(Task):
    head = "dual_encoder"
    kind = "retrieval"
    batch = schema.RETRIEVAL
    optional_batch = schema.NEGATIVES  # training rows with hard negatives
    metrics = ("mrr@10", "recall@1", "recall@10", "ndcg@10")

    @classmethod
    def labels_from(cls, examples, settings: TaskSettings) -> list[str]:
        return []

    @property
    def objective(self):
        return objectives.in_batch(self.settings.temperature)

    def model(self, encoder, freeze_encoder):
        if freeze_encoder:
            raise UserError("finetune.freeze_encoder would leave a dual encoder nothing to train")
        return DualEncoder(encoder, self.settings.pooling, self.settings.separate_encoders)

    def encode(self, tokenizer, examples: Sequence[TextExample], where, *, training):
        _check_texts(examples, where)
        counts = collections.Counter()
        s = self.settings
        sides = {"query": ([e.text for e in examples], s.max_query_length),
                 "document": ([e.text_pair for e in examples], s.max_seq_len)}
        if training and examples and examples[0].negative is not None:
            sides["negative"] = ([e.negative for e in examples], s.max_seq_len)
        arrays = {}
        for side, (texts, length) in sides.items():
            ids, mask, cut = _rows(tokenizer, texts, length)
            setting = "data.max_query_length" if side == "query" else "data.max_seq_len"
            counts[f"{_PLURALS[side]} cut to {length} tokens ({setting})"] += cut
            arrays[f"{side}_ids"], arrays[f"{side}_mask"] = ids, mask
            if side != "query":
                arrays[f"{side}_key"] = np.asarray([text_key(t) for t in texts], np.int32)
        arrays["weight"] = np.ones(len(examples), np.float32)
        return Features(arrays, counts)

    def evaluate(self, examples, features, outputs: Outputs) -> dict:
        queries, documents, relevant = _distinct(examples)
        _, ranked = exact.search(outputs["document"][documents], outputs["query"][queries],
                                 min(SEARCH_DEPTH, len(documents)))
        return ranking.mean_metrics(ranked.tolist(), relevant)

    def predict(self, examples, features, outputs: Outputs) -> list[dict]:
        scores = np.sum(outputs["query"] * outputs["document"], axis=-1)
        return [{"id": e.id, "score": round(float(s), 6)} for e, s in zip(examples, scores)]

    def heads_info(self) -> dict:
        return {**super().heads_info(), "pooling": self.settings.pooling,
                "encoders": encoder_names(self.settings.separate_encoders)}

    def output_keys(self) -> tuple[str, ...]:
        return ("query", "document")

    def encoder_subtrees(self) -> tuple[str, ...]:
        return tuple(dict.fromkeys(encoder_names(self.settings.separate_encoders).values()))


def _check_texts(examples: Sequence[TextExample], where: str) -> None:
    for e in examples:
        if e.text_pair is None:
            raise UserError(f"{where}: retrieval scores (query, document) pairs; example {e.id} "
                            "has no document (set data.text_pair_column, or pass pairs=)")
        for name, text in (("query", e.text), ("document", e.text_pair),
                           ("negative", e.negative)):
            if text is not None and not text.strip():
                raise UserError(f"{where}: example {e.id}: the {name} is empty")


def _rows(tokenizer, texts: list[str], length: int) -> tuple[np.ndarray, np.ndarray, int]:
    """[CLS] text [SEP] rows padded to `length`, their mask, and how many were cut."""
    ids, mask = np.zeros((len(texts), length), np.int32), np.zeros((len(texts), length), np.int32)
    cut = 0
    for i, pieces in enumerate(tokenizer.encode_batch(texts)):
        cut += len(pieces) > length - 2
        row, _ = assemble(tokenizer, pieces[:length - 2], None)
        ids[i, :len(row)], mask[i, :len(row)] = row, 1
    return ids, mask, cut


def _distinct(examples: Sequence[TextExample]) -> tuple[list[int], list[int], list[set[int]]]:
    """(the first row of each distinct query, the first row of each distinct document, each
    distinct query's relevant documents as indices into the distinct documents)."""
    query_rows: dict[str, int] = {}
    documents: dict[str, tuple[int, int]] = {}  # text -> (index, first row)
    relevant = collections.defaultdict(set)
    for row, e in enumerate(examples):
        query_rows.setdefault(e.text, row)
        index, _ = documents.setdefault(e.text_pair, (len(documents), row))
        relevant[e.text].add(index)
    return (list(query_rows.values()), [row for _, row in documents.values()],
            [relevant[text] for text in query_rows])
