"""Classification as a cloze task (`finetune.method=cloze`, or soft_prompt with a verbalizer):
each label is scored by the pretrained MLM head's logit of its verbalizer word at the template's
[MASK], and the loss is the cross-entropy over those logits. Metrics and predictions are the
classification task's: only the inputs and the head differ.
"""

from __future__ import annotations

from typing import Sequence

from bertjax.data.tokenizer import Tokenizer
from bertjax.finetune import cloze, schema
from bertjax.finetune.tasks.base import TaskSettings
from bertjax.finetune.tasks.sentence import Classification, check_pairs
from bertjax.model.prompting import ClozeClassifier


class ClozeClassification(Classification):
    head = "cloze_classification"
    batch = schema.CLOZE
    packed_batch = None  # scored at the template's [MASK], not at [CLS]

    def __init__(self, settings: TaskSettings, labels: Sequence[str], tokenizer: Tokenizer):
        super().__init__(settings, labels)
        cloze.parse_template(settings.template)
        self.words = cloze.parse_verbalizer(settings.verbalizer)
        self.verbalizer_ids = cloze.verbalizer_ids(tokenizer, self.words, self.labels)

    def model(self, encoder, freeze_encoder):
        return ClozeClassifier(encoder, self.verbalizer_ids, self.settings.prompt_length)

    def encode(self, tokenizer, examples, where, *, training):
        check_pairs(examples, where)
        s = self.settings
        layout = cloze.ClozeLayout(s.template, s.max_seq_len, s.prompt_length)
        return cloze.encode_cloze(tokenizer, examples, layout,
                                  self.label_ids(examples, where), where)

    def heads_info(self) -> dict:
        return {**super().heads_info(), "template": self.settings.template,
                "verbalizer": {label: self.words[label] for label in self.labels},
                "verbalizer_ids": list(self.verbalizer_ids)}
