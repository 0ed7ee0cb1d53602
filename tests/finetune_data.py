"""Real-text fine-tuning data built at test time (nothing is committed).

The Wikipedia demo articles give a sentence-pair task and extractive QA: for every sentence that
names exactly one year, a question is that sentence with the year taken out; the SQuAD-format
context is the sentence with its year-free neighbours, the answer the year. The pair task is QNLI's
question: does sentence B (the question's own sentence, or another sentence of the same article
that names no year) hold the answer to question A?
"""

from __future__ import annotations

import json
import random
import re

YEAR = re.compile(r"\b(1[5-9]\d\d|20[0-2]\d)\b")


def year_questions(articles: list[list[str]]) -> list[dict]:
    """One record per sentence with exactly one year: article index, question, context, answer."""
    records = []
    for index, sentences in enumerate(articles):
        for i, sentence in enumerate(sentences):
            years = YEAR.findall(sentence)
            if len(years) != 1 or len(sentence) > 250:
                continue
            before = [s for s in sentences[max(i - 1, 0):i] if not YEAR.search(s)]
            after = [s for s in sentences[i + 1:i + 2] if not YEAR.search(s)]
            context = " ".join(before + [sentence] + after)
            question = "When: " + " ".join(YEAR.sub(" ", sentence).split()[:12]) + "?"
            start = context.index(sentence) + YEAR.search(sentence).start()
            records.append({"article": index, "sentence_index": i, "question": question,
                            "context": context, "answer": years[0], "answer_start": start})
    return records


def write_squad(path: str, records: list[dict]) -> None:
    paragraphs = [{"context": r["context"], "qas": [{
        "id": f"q{r['article']}-{r['sentence_index']}", "question": r["question"],
        "answers": [{"text": r["answer"], "answer_start": r["answer_start"]}]}]}
        for r in records]
    with open(path, "w", encoding="utf-8") as f:
        json.dump({"version": "1.1", "data": [{"title": "wiki", "paragraphs": paragraphs}]}, f)


def write_qnli(path: str, records: list[dict], articles: list[list[str]], seed: int) -> None:
    """GLUE-style TSV: question, sentence, label (1: the sentence answers the question)."""
    rng = random.Random(seed)
    rows = [["index", "question", "sentence", "label"]]
    yearless: dict[int, list[str]] = {}  # per article, searched once (not once per question)
    for n, r in enumerate(records):
        sentences = articles[r["article"]]
        own = sentences[r["sentence_index"]]
        others = []
        if n % 2:
            if r["article"] not in yearless:
                yearless[r["article"]] = [s for s in sentences if not YEAR.search(s)]
            others = [s for s in yearless[r["article"]] if s != own]
        if not others:
            rows.append([str(n), r["question"], own, "1"])
        else:
            rows.append([str(n), r["question"], rng.choice(others), "0"])
    with open(path, "w", encoding="utf-8") as f:
        f.writelines("\t".join(" ".join(cell.split()) for cell in row) + "\n" for row in rows)


def split_by_article(records: list[dict], dev_fraction: float = 0.2) -> tuple[list, list]:
    """Whole articles go to one side, so dev questions come from unseen articles."""
    articles = sorted({r["article"] for r in records})
    cut = articles[int(len(articles) * (1 - dev_fraction))]
    return ([r for r in records if r["article"] < cut], [r for r in records if r["article"] >= cut])
