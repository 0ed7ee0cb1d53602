"""Token classification with BIO tags (named entities): entity-level F1, optional CRF.

The label set is "O" plus B- and I- of every entity type in the training set (both, even for a
type seen only as B-, so a continued subword always has its I- tag). Tags are checked to be BIO.
Evaluation reads each word's tag from its first subword; a word cut by max_seq_len is tagged O.
"""

from __future__ import annotations

import numpy as np

from bertjax.core.errors import UserError
from bertjax.finetune import features as feats
from bertjax.finetune import objectives, schema, scoring
from bertjax.finetune.tasks.base import Outputs, Task, TaskSettings, ids_of
from bertjax.model.task_heads import TokenClassifier


def _check_bio(tags, where: str) -> None:
    bad = sorted({t for t in tags if t != "O" and not (t[:2] in ("B-", "I-") and len(t) > 2)})
    if bad:
        raise UserError(f"{where}: tag(s) {', '.join(map(repr, bad[:5]))} are not BIO "
                        "(expected O, B-TYPE or I-TYPE)")


class TokenClassification(Task):
    head = "token_classification"
    kind = "tagged"
    batch = schema.TOKEN_CLASSIFICATION
    metrics = ("entity_f1", "entity_precision", "entity_recall", "token_accuracy")

    @classmethod
    def labels_from(cls, examples, settings: TaskSettings) -> list[str]:
        tags = [t for e in examples for t in e.tags]
        _check_bio(tags, "the training set")
        if settings.labels:
            _check_bio(settings.labels, "data.labels")
            # A B-X word's continuation subwords are tagged I-X: it must have an id.
            missing = sorted({feats.continuation_tag(t) for t in settings.labels}
                             - set(settings.labels))
            if missing:
                raise UserError(f"data.labels lacks {', '.join(map(repr, missing[:5]))}: every "
                                "B-TYPE needs its I-TYPE (continuation subwords carry it)")
            ids_of(tags, settings.labels, "the training set")
            return list(settings.labels)
        types = sorted({t[2:] for t in tags if t != "O"})
        if not types:
            raise UserError("the training set has no entity: every tag is O")
        return ["O"] + [f"{prefix}-{kind}" for kind in types for prefix in "BI"]

    @property
    def objective(self):
        return objectives.CRF_TAGGING if self.settings.crf else objectives.TAGGING

    def model(self, encoder, freeze_encoder):
        return TokenClassifier(encoder, len(self.labels), use_crf=self.settings.crf,
                               freeze_encoder=freeze_encoder)

    def encode(self, tokenizer, examples, where, *, training):
        labeled = [t for e in examples if e.tags is not None for t in e.tags]
        ids_of(labeled, self.labels, where)  # refuses unseen tags by name
        index = {label: i for i, label in enumerate(self.labels)}
        return feats.encode_tagged(tokenizer, examples, self.settings.max_seq_len, index,
                                   self.settings.all_subwords)

    def word_tags(self, examples, features, outputs: Outputs) -> list[list[str]]:
        """Each example's predicted tag per word (first subword; O for words that were cut,
        which are always the last ones: features keep a prefix of the words)."""
        out = []
        for example, starts, tags in zip(examples, features.word_starts, outputs["tags"]):
            predicted = [self.labels[int(t)] for t in tags[starts]]
            out.append(predicted + ["O"] * (len(example.words) - len(predicted)))
        return out

    def evaluate(self, examples, features, outputs: Outputs) -> dict:
        predicted = self.word_tags(examples, features, outputs)
        gold = [e.tags for e in examples]
        scores = scoring.entity_scores(gold, predicted)
        flat_gold = [t for tags in gold for t in tags]
        flat_predicted = [t for tags in predicted for t in tags]
        scores["token_accuracy"] = float(np.mean([a == b for a, b in
                                                  zip(flat_gold, flat_predicted)]))
        return scores

    def predict(self, examples, features, outputs: Outputs) -> list[dict]:
        return [{"id": e.id, "words": e.words, "tags": tags}
                for e, tags in zip(examples, self.word_tags(examples, features, outputs))]

    def heads_info(self) -> dict:
        return {**super().heads_info(), "crf": self.settings.crf}

    def output_keys(self) -> tuple[str, ...]:
        return ("tags",)
