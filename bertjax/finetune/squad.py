"""SQuAD v1.1 JSON (data -> paragraphs -> qas) in, as QA examples.

A file that does not have that shape is refused in one line naming the file and the place in it
("data[0].paragraphs[2].qas[1] (id 57) has no answers"), never with a bare KeyError's text.
"""

from __future__ import annotations

import json

from bertjax.core.errors import UserError
from bertjax.finetune.examples import QAExample


def read_squad(path: str, labeled: bool = True) -> list[QAExample]:
    """SQuAD v1.1 JSON: data -> paragraphs -> qas. Unlabeled input (prediction) may leave the
    answers out; anything else missing is refused naming the file and where in it."""
    try:
        with open(path, encoding="utf-8-sig") as f:
            document = json.load(f)
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise UserError(f"{path} is not SQuAD JSON: {e}") from None
    examples = []
    for i, article in enumerate(_field(path, document, "data", list, "the top level")):
        for j, paragraph in enumerate(_field(path, article, "paragraphs", list, f"data[{i}]")):
            where = f"data[{i}].paragraphs[{j}]"
            context = _field(path, paragraph, "context", str, where)
            for k, qa in enumerate(_field(path, paragraph, "qas", list, where)):
                examples.append(_example(path, qa, context, f"{where}.qas[{k}]", labeled))
    return examples


def _example(path: str, qa, context: str, where: str, labeled: bool) -> QAExample:
    qid = str(_field(path, qa, "id", (str, int), where))
    question = _field(path, qa, "question", str, where)
    where = f"{where} (id {qid})"
    answers = []
    if labeled or "answers" in qa:
        listed = _field(path, qa, "answers", list, where)
        if labeled and not listed:
            raise UserError(f"{path}: {where} has an empty \"answers\" list; training and "
                            "evaluation data need at least one answer a question")
        for n, answer in enumerate(listed):
            at = f"{where} answers[{n}]"
            answers.append((_field(path, answer, "text", str, at),
                            _field(path, answer, "answer_start", int, at)))
    return QAExample(qid, question, context, answers)


_EXPECTED = {str: "a string", int: "an integer", list: "a list"}


def _field(path: str, parent, key: str, kind, where: str):
    """parent[key], which must be of `kind`; else one line saying where the shape breaks."""
    refusal = f"{path} is not SQuAD v1.1 JSON (data -> paragraphs -> qas): {where}"
    if not isinstance(parent, dict):
        raise UserError(f"{refusal} is a JSON {_json_kind(parent)}, expected an object with "
                        f"\"{key}\"")
    if key not in parent:
        raise UserError(f"{refusal} has no \"{key}\"")
    value = parent[key]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise UserError(f"{refusal}: \"{key}\" is a JSON {_json_kind(value)}, expected "
                        f"{_EXPECTED.get(kind, 'a string or a number')}")
    return value


def _json_kind(value) -> str:
    names = {dict: "object", list: "list", str: "string", bool: "boolean", int: "number",
             float: "number", type(None): "null"}
    return names.get(type(value), type(value).__name__)
