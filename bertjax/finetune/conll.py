"""CoNLL files in, as tagged examples: one token a line with its tag in the last field."""

from __future__ import annotations

from bertjax.core.errors import UserError
from bertjax.finetune.examples import TaggedExample


def read_conll(path: str, labeled: bool = True) -> list[TaggedExample]:
    """CoNLL: one token a line with its tag in the LAST field (tab- or space-separated), a blank
    line between sentences; -DOCSTART- lines are skipped. Unlabeled input: one token a line."""
    examples: list[TaggedExample] = []
    words: list[str] = []
    tags: list[str] = []

    def close() -> None:
        if words:
            examples.append(TaggedExample(str(len(examples)), list(words),
                                          list(tags) if labeled else None))
        words.clear()
        tags.clear()

    try:
        with open(path, encoding="utf-8-sig") as f:
            for number, line in enumerate(f, 1):
                line = line.rstrip("\r\n")
                fields = line.split("\t") if "\t" in line else line.split()
                fields = [x.strip() for x in fields]
                if not any(fields):
                    close()
                    continue
                if fields[0] == "-DOCSTART-":
                    continue
                if labeled and (len(fields) < 2 or not fields[-1]):
                    raise UserError(f"{path}:{number}: expected 'token<TAB>tag', the tag is "
                                    "missing")
                words.append(fields[0])
                tags.append(fields[-1])
    except UnicodeDecodeError as e:
        raise UserError(f"{path} is not UTF-8 text: {e.reason}") from None
    close()
    return examples
