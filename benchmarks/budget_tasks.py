"""The downstream tasks of benchmarks/budget_pretraining.py: each one's fine-tuning config, the
metric it is scored by, its training and test data, and the recipe shared by every starting point."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class Task:
    config: str
    metric: str
    train: str  # data.train and data.eval (the split scored); {pairs}: the pair files' folder
    test: str
    kind: str  # text | tagged: which baseline applies
    overrides: tuple = ()

    def files(self, pairs: str) -> tuple[str, str]:
        return self.train.format(pairs=pairs), self.test.format(pairs=pairs)


# The same fine-tuning recipe for every starting point; the training sets capped so a table of
# several seeds fits an afternoon on 2 CPU cores.
TASKS = {
    "sentiment": Task("configs/finetune_sentiment.py", "accuracy", "packaged:movie_reviews:train",
                      "packaged:movie_reviews:test", "text",
                      (("train.epochs", 2), ("optimizer.learning_rate", 3e-4),
                       ("data.max_train_examples", 3000))),
    "ner": Task("configs/finetune_ner.py", "entity_f1", "packaged:tweet_ner:train",
                "packaged:tweet_ner:test", "tagged",
                (("train.epochs", 3), ("optimizer.learning_rate", 1e-3),
                 ("data.max_seq_len", 64))),
    # Is this passage the one the sentence was taken from? Its positive, a hard negative (another
    # paragraph of the article) and a random one per sentence (bertjax.retrieval.wiki_pairs): a
    # third are positives. No human-labelled pair set ships in the registries; these articles
    # are in the pretraining corpus (their text, not these labels).
    "pair": Task("configs/finetune_pair.py", "accuracy", "{pairs}/pairs_train.tsv",
                 "{pairs}/pairs_test.tsv", "text",
                 (("train.epochs", 2), ("optimizer.learning_rate", 3e-4),
                  ("data.max_train_examples", 1500), ("data.max_seq_len", 128))),
    # The Brown corpus's tags reduced to the 12 universal POS tags (packaged:brown_pos); the
    # tagging job scores each word as a one-word chunk, so token accuracy is the figure.
    "pos": Task("configs/finetune_ner.py", "token_accuracy", "packaged:brown_pos:train",
                "packaged:brown_pos:test", "tagged",
                (("train.epochs", 2), ("optimizer.learning_rate", 1e-3),
                 ("data.max_train_examples", 2000), ("data.max_eval_examples", 1000),
                 ("data.max_seq_len", 64))),
}
