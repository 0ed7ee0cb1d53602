"""benchmarks/budget_pretraining.py's baselines without pretraining and its curve.

- Text classification (single sentences or pairs): TF-IDF bag of words + logistic regression
  (L2, C = 1, L-BFGS), trained on the task's full training split, scored on its test split; a
  pair is the TF-IDF of each side and their elementwise product.
- Tagging: each word's most frequent training tag (the classic POS baseline), the most frequent
  tag overall for unseen words; for entity tagging the same rule, scored as entity F1.
"""

from __future__ import annotations

import collections
import csv
import math
import re

import numpy as np
import scipy.optimize
import scipy.sparse

from bertjax.finetune.examples import TextExample
from bertjax.finetune.packaged.datasets import read_packaged

_TOKEN = re.compile(r"(?u)\b\w\w+\b")  # scikit-learn's TfidfVectorizer default


def read_examples(spec: str, kind: str) -> list:
    """A packaged dataset, or a pair file in GLUE's MRPC layout (bertjax.retrieval.wiki_pairs)."""
    if spec.startswith("packaged:"):
        return read_packaged(spec, kind)
    with open(spec, newline="", encoding="utf-8") as f:
        rows = list(csv.DictReader(f, delimiter="\t", quoting=csv.QUOTE_NONE))
    return [TextExample(r["#1 ID"], r["#1 String"], r["#2 String"], r["Quality"]) for r in rows]


def fit_tfidf(train: list[str]):
    """TF-IDF rows (CSR, unit length) of any texts, with the vocabulary and idf of `train`."""
    vocabulary, df = {}, collections.Counter()
    for text in train:
        df.update(set(_TOKEN.findall(text.lower())))
    for word in sorted(df):
        vocabulary[word] = len(vocabulary)
    idf = np.array([math.log((1 + len(train)) / (1 + df[w])) + 1 for w in vocabulary])

    def rows(texts):
        data, cols, indptr = [], [], [0]
        for text in texts:
            counts = collections.Counter(w for w in _TOKEN.findall(text.lower()) if w in vocabulary)
            values = np.array([c * idf[vocabulary[w]] for w, c in counts.items()])
            norm = np.linalg.norm(values) or 1.0
            cols += [vocabulary[w] for w in counts]
            data += list(values / norm)
            indptr.append(len(cols))
        return scipy.sparse.csr_matrix((data, cols, indptr), shape=(len(texts), len(vocabulary)))
    return rows


def logistic_regression(x, y: np.ndarray, classes: int, c: float = 1.0) -> np.ndarray:
    """Softmax regression weights [features + 1, classes], L2-regularised as scikit-learn's."""
    x = scipy.sparse.hstack([x, np.ones((x.shape[0], 1))]).tocsr()
    onehot = np.eye(classes)[y]

    def loss(flat):
        w = flat.reshape(x.shape[1], classes)
        logits = x @ w
        logits -= logits.max(axis=1, keepdims=True)
        log_p = logits - np.log(np.exp(logits).sum(axis=1, keepdims=True))
        grad = x.T @ (np.exp(log_p) - onehot) + w / c
        return -(onehot * log_p).sum() + 0.5 * (w * w).sum() / c, grad.ravel()

    result = scipy.optimize.minimize(loss, np.zeros(x.shape[1] * classes), jac=True,
                                     method="L-BFGS-B", options={"maxiter": 500})
    return result.x.reshape(x.shape[1], classes)


def text_baseline(train_spec: str, test_spec: str) -> float:
    train, test = read_examples(train_spec, "text"), read_examples(test_spec, "text")
    labels = sorted({e.label for e in train})
    y = np.array([labels.index(e.label) for e in train])
    pairs = train[0].text_pair is not None
    rows = fit_tfidf([e.text for e in train] + ([e.text_pair for e in train] if pairs else []))
    x_train, x_test = rows([e.text for e in train]), rows([e.text for e in test])
    if pairs:
        b_train, b_test = rows([e.text_pair for e in train]), rows([e.text_pair for e in test])
        x_train = scipy.sparse.hstack([x_train, b_train, x_train.multiply(b_train)])
        x_test = scipy.sparse.hstack([x_test, b_test, x_test.multiply(b_test)])
    w = logistic_regression(x_train, y, len(labels))
    x_test = scipy.sparse.hstack([x_test, np.ones((x_test.shape[0], 1))]).tocsr()
    predicted = np.asarray(x_test @ w).argmax(axis=1)
    return float(np.mean([labels[p] == e.label for p, e in zip(predicted, test)]))


def _entities(tags: list[str]) -> set:
    found, start, kind = set(), None, None
    for i, tag in enumerate(list(tags) + ["O"]):
        inside = tag.startswith("I-") and kind == tag[2:]
        if start is not None and not inside:
            found.add((start, i, kind))
            start = kind = None
        if tag.startswith("B-") or (tag.startswith("I-") and not inside):
            start, kind = i, tag[2:]
    return found


def tagging_baseline(train_spec: str, test_spec: str, metric: str) -> float:
    train, test = read_examples(train_spec, "tagged"), read_examples(test_spec, "tagged")
    by_word = collections.defaultdict(collections.Counter)
    for sentence in train:
        for word, tag in zip(sentence.words, sentence.tags):
            by_word[word.lower()][tag] += 1
    overall = collections.Counter(t for s in train for t in s.tags).most_common(1)[0][0]
    guess = lambda w: by_word[w.lower()].most_common(1)[0][0] if w.lower() in by_word else overall  # noqa: E731
    if metric != "entity_f1":
        pairs = [(guess(w), t) for s in test for w, t in zip(s.words, s.tags)]
        return float(np.mean([g == t for g, t in pairs]))
    true = predicted = correct = 0
    for s in test:
        gold, guessed = _entities(s.tags), _entities([guess(w) for w in s.words])
        true, predicted, correct = true + len(gold), predicted + len(guessed), correct + len(
            gold & guessed)
    return 2 * correct / max(true + predicted, 1)


def run(tasks: dict) -> dict:
    """{baseline name: {task: score}}; `tasks`: {name: (kind, metric, train, test)}. Text tasks
    get TF-IDF + logistic regression, tagging tasks the most frequent tag per word."""
    results = {"TF-IDF + logistic regression": {}, "most frequent tag per word": {}}
    for name, (kind, metric, train, test) in tasks.items():
        if kind == "text":
            results["TF-IDF + logistic regression"][name] = text_baseline(train, test)
        else:
            results["most frequent tag per word"][name] = tagging_baseline(train, test, metric)
    return {k: v for k, v in results.items() if v}


def plot(path: str, args, starts: dict, scores: dict, baselines: dict) -> None:
    import matplotlib  # deferred: only the benchmark's last step draws
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, len(args.tasks), figsize=(4.5 * len(args.tasks), 3.6),
                             squeeze=False)
    for ax, task in zip(axes[0], args.tasks):
        for framework, style in (("bertjax", "o-"), ("transformers", "s--")):
            points = [(p["minutes"], scores[s][task]) for s, p in starts.items()
                      if p is not None and s.startswith(framework) and scores[s][task]]
            if points:
                xs = [0.0] + [m for m, _ in points]
                means = [np.mean(scores["random init"][task])] + [np.mean(v) for _, v in points]
                stds = [np.std(scores["random init"][task])] + [np.std(v) for _, v in points]
                ax.errorbar(xs, means, yerr=stds, fmt=style, capsize=3, label=framework)
        ax.axhline(np.mean(scores["random init"][task]), color="grey", ls=":",
                   label="random init")
        for name, by_task in baselines.items():
            if task in by_task:
                ax.axhline(by_task[task], color="tab:red", ls="-.", label=name)
        ax.set_title(task)
        ax.set_xlabel("pretraining wall time (minutes)")
        ax.set_ylabel("test score")
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
