"""Extractive question answering (SQuAD v1.1): the best span over every window of a context.

A span (s, e) is a candidate when both ends are context tokens, s <= e, it is at most
`max_answer_length` tokens long, and window gives `s` its maximal context (each token is judged in
one window only); its score is start_logit[s] + end_logit[e]. The answer is the original context
text from the first word's first character to the last word's last one.

With `qa_scorer=span` each candidate (s, s + k), k < max_answer_length, has its own score from
the span representation (bertjax.model.span_heads.SpanScorer); the same candidates are searched.
"""

from __future__ import annotations

import numpy as np

from bertjax.finetune import features as feats
from bertjax.finetune import objectives, schema, scoring
from bertjax.finetune.tasks.base import Outputs, Task, TaskSettings
from bertjax.model.span_heads import SpanScorer
from bertjax.model.task_heads import MASKED_LOGIT, SpanExtractor


def best_span(start_logits: np.ndarray, end_logits: np.ndarray, allowed_start: np.ndarray,
              allowed_end: np.ndarray, max_length: int) -> tuple[float, int, int]:
    """(score, start, end) of the best span in one window; score -inf when there is none."""
    starts, ends = np.flatnonzero(allowed_start), np.flatnonzero(allowed_end)
    if not starts.size or not ends.size:
        return -np.inf, -1, -1
    scores = start_logits[starts][:, None] + end_logits[ends][None, :]
    gap = ends[None, :] - starts[:, None]
    scores = np.where((gap >= 0) & (gap < max_length), scores, -np.inf)
    flat = int(np.argmax(scores))
    i, j = divmod(flat, len(ends))
    return float(scores[i, j]), int(starts[i]), int(ends[j])


def best_scored_span(scores: np.ndarray, allowed_start: np.ndarray) -> tuple[float, int, int]:
    """(score, start, end) of the best cell of a window's span scores [L, K] (start allowed,
    cells off the context masked); score -inf when there is none."""
    valid = allowed_start[:, None] & (scores > MASKED_LOGIT / 2)
    if not valid.any():
        return -np.inf, -1, -1
    masked = np.where(valid, scores, -np.inf)
    start, width = divmod(int(np.argmax(masked)), scores.shape[1])
    return float(masked[start, width]), start, start + width


class QuestionAnswering(Task):
    """`qa_scorer=start_end` (BERT's): start_logit[s] + end_logit[e]; `qa_scorer=span`: a small
    MLP over the span representation [h_s; h_e; pooled] of every candidate (span_heads)."""

    head = "question_answering"
    kind = "qa"
    batch = schema.QUESTION_ANSWERING
    metrics = ("f1", "exact_match")

    @property
    def span_scorer(self) -> bool:
        return self.settings.qa_scorer == "span"

    @property
    def objective(self):
        return objectives.SPAN_SCORES if self.span_scorer else objectives.SPANS

    @classmethod
    def labels_from(cls, examples, settings: TaskSettings) -> list[str]:
        return ["start", "end"]

    def model(self, encoder, freeze_encoder):
        if self.span_scorer:
            return SpanScorer(encoder, self.settings.max_answer_length,
                              pooling=self.settings.span_pooling, freeze_encoder=freeze_encoder)
        return SpanExtractor(encoder, freeze_encoder=freeze_encoder)

    def encode(self, tokenizer, examples, where, *, training):
        s = self.settings
        features = feats.encode_qa(tokenizer, examples, feats.QASettings(
            s.max_seq_len, s.doc_stride, s.max_query_length, training=training))
        if training and self.span_scorer:
            a = features.arrays
            longer = a["end_positions"] - a["start_positions"] >= s.max_answer_length
            a["weight"] = np.where(longer, 0.0, a["weight"]).astype(np.float32)
            features.counts["training window(s) with an answer longer than "
                            "max_answer_length, not scored (span scorer)"] += int(longer.sum())
        return features

    def answers(self, examples, features, outputs: Outputs) -> dict[str, str]:
        w = features.windows
        best: dict[int, tuple[float, int, int, int]] = {}
        for row, index in enumerate(w.example):
            in_context = w.token_word[row] >= 0
            if self.span_scorer:
                score, s, e = best_scored_span(outputs["span_scores"][row],
                                               in_context & w.max_context[row])
            else:
                score, s, e = best_span(outputs["start_logits"][row],
                                        outputs["end_logits"][row],
                                        in_context & w.max_context[row], in_context,
                                        self.settings.max_answer_length)
            if s >= 0 and score > best.get(int(index), (-np.inf,))[0]:
                best[int(index)] = (score, row, s, e)
        out = {}
        for index, example in enumerate(examples):
            if index not in best:
                out[example.id] = ""
                continue
            _, row, s, e = best[index]
            offsets = w.word_offsets[index]
            first, last = w.token_word[row, s], w.token_word[row, e]
            out[example.id] = example.context[offsets[first][0]:offsets[last][1]]
        return out

    def evaluate(self, examples, features, outputs: Outputs) -> dict:
        predicted = self.answers(examples, features, outputs)
        gold = {e.id: [text for text, _ in e.answers] for e in examples}
        return scoring.squad_scores(gold, predicted)

    def predict(self, examples, features, outputs: Outputs) -> dict[str, str]:
        return self.answers(examples, features, outputs)

    def output_keys(self) -> tuple[str, ...]:
        return ("span_scores",) if self.span_scorer else ("start_logits", "end_logits")

    def heads_info(self) -> dict:
        if not self.span_scorer:
            return super().heads_info()
        # Its own head name: no Hugging Face class holds it (export refuses it by name).
        return {**super().heads_info(), "head": "question_answering_span",
                "span_pooling": self.settings.span_pooling}
