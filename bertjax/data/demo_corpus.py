"""The demo corpus: real English Wikipedia articles as plain text, one sentence a line.

The articles come from the small MediaWiki dump in gensim's test data (`packaged.WIKIPEDIA_SAMPLE`,
fetched from the package registry); they are written in the "sentences" layout (a blank line
between articles), which is what the demo config and the tests read.

    python -m bertjax.data.demo_corpus --output DIR/wiki.txt
"""

from __future__ import annotations

import argparse
import os
import sys

from bertjax.core import atomic_files
from bertjax.core import packaged
from bertjax.data.sources import SourceStats, iter_documents
from bertjax.core.errors import EXIT_BAD_INPUT, UserError, exit_on_user_error, report

DEMO_FILE = os.path.join("demo", "wiki.txt")


def write_demo_corpus(output: str) -> dict:
    """Writes the corpus to `output` atomically (a killed run leaves no partial file); counts."""
    dump = packaged.fetch(packaged.WIKIPEDIA_SAMPLE)
    stats = SourceStats()
    words = 0
    directory = os.path.dirname(os.path.abspath(output))
    try:
        os.makedirs(directory, exist_ok=True)
        with atomic_files.replacing(output) as f:
            for i, document in enumerate(iter_documents([dump], "mediawiki", stats=stats)):
                f.write(("\n" if i else "") + "".join(s + "\n" for s in document))
                words += sum(len(s.split()) for s in document)
    except OSError as e:
        raise UserError(f"cannot write {output}: {e}") from None
    return {"articles": stats.documents, "redirects_dropped": stats.skipped_pages["redirect"],
            "other_pages_dropped": sum(stats.skipped_pages.values())
            - stats.skipped_pages["redirect"], "sentences": stats.sentences, "words": words}


def demo_corpus_path(cache_dir: str | None = None) -> str:
    """Path of the demo corpus, written once under `cache_dir` (default: packaged.cache_dir())."""
    path = os.path.join(cache_dir or packaged.cache_dir(), DEMO_FILE)
    if not os.path.exists(path):
        write_demo_corpus(path)  # concurrent writers each rename a complete, identical file
    return path


def describe(counts: dict) -> str:
    return (f"{counts['articles']} articles kept, {counts['redirects_dropped']} redirects dropped "
            f"({counts['other_pages_dropped']} other pages dropped), {counts['sentences']} "
            f"sentences, {counts['words']} words")


@exit_on_user_error
def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bertjax.data.demo_corpus",
                                     description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", required=True, help="the file to write (e.g. DIR/wiki.txt)")
    parser.error = lambda message: (report(message), sys.exit(EXIT_BAD_INPUT))
    args = parser.parse_args(argv)
    if os.path.exists(args.output):
        print(f"{args.output} exists already; left as it is")
        return
    counts = write_demo_corpus(args.output)
    print(f"wrote {args.output}: {describe(counts)}")


if __name__ == "__main__":
    main(sys.argv[1:])
