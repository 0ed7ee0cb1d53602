"""The catalog of bad input: realistic mistakes for every command-line entry point, each one a
`Case` that test_catalog.py runs (in-process, or as a real process where that matters) and
expects refused in one line.

Arguments are templates. `{pre}`, `{ft}`, `{params}`, `{hf}`, `{corpus}` and `{files}` name the
shared inputs (a finished pretraining workdir, a finished fine-tuning workdir made from it (a
single-sentence classifier), its params and Hugging Face exports, a prepared corpus, small data
files); `{index}` a retrieval index of {files}/docs.jsonl built with `{pre}` (exact and
approximate, no standardisation), `{stats}` a directory holding mean.npz (z-score statistics of
`{pre}`'s mean-pooled vectors over all its layers, fitted on {files}/docs.txt) and `{senses}` a
sense index fitted with `{pre}` on four hand-made examples of three senses of "bank"; `{cfg}` the
configs directory; `{tmp}` the case's own directory (made before the case, with what its `setup`
puts there) and `{new}` a path inside it that a refused command must not create. Every directory
a case names must be left as it was, byte for byte and entry for entry.
"""

from __future__ import annotations

import dataclasses
import io
import json
import os
import shutil
import string
from typing import Callable

import numpy as np

# The shared inputs a case may name: each is watched whenever a case names it.
SHARED = ("pre", "ft", "params", "hf", "corpus", "files", "index", "stats", "senses")
GARBAGE = b"\x00\xff\xfe garbage \x13\x37 not json {"


@dataclasses.dataclass(frozen=True)
class Case:
    id: str
    module: str                  # `python -m bertjax.<module>`
    args: tuple[str, ...]        # templates (see the module docstring)
    expect: str                  # a phrase of the one error line: the reason it was refused
    setup: Callable[[str, dict], None] | None = None  # (tmp, paths) -> None: the case's inputs

    def arguments(self, paths: dict) -> list[str]:
        return [arg.format(**paths) for arg in self.args]

    def named(self) -> set[str]:
        """The placeholders its arguments use."""
        return {field for arg in self.args for _, field, _, _ in string.Formatter().parse(arg)
                if field}


# --- setups: the case's own inputs, written into its directory ----------------------------------

def _put(path: str, content: str | bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(content.encode() if isinstance(content, str) else content)


def _write(name: str, content: str | bytes) -> Callable[[str, dict], None]:
    return lambda tmp, paths: _put(os.path.join(tmp, name), content)


def _copy(what: str, then: Callable[[str], None] | None = None) -> Callable[[str, dict], None]:
    """A copy of a shared workdir at {tmp}/wd, then changed by `then(copy)`."""
    def setup(tmp: str, paths: dict) -> None:
        copy = os.path.join(tmp, "wd")
        shutil.copytree(paths[what], copy)
        if then is not None:
            then(copy)
    return setup


def _garbage(name: str) -> Callable[[str], None]:
    return lambda directory: _put(os.path.join(directory, name), GARBAGE)


def _remove(name: str) -> Callable[[str], None]:
    return lambda directory: os.remove(os.path.join(directory, name))


def _stopped_before_a_checkpoint(directory: str) -> None:
    """What a run killed before its first checkpoint leaves: a record and no checkpoint."""
    shutil.rmtree(os.path.join(directory, "checkpoints"))
    os.mkdir(os.path.join(directory, "checkpoints"))


def _edit_json(name: str, edit: Callable[[dict], None]) -> Callable[[str], None]:
    def change(directory: str) -> None:
        path = os.path.join(directory, name)
        with open(path, encoding="utf-8") as f:
            value = json.load(f)
        edit(value)
        with open(path, "w", encoding="utf-8") as f:
            json.dump(value, f)
    return change


def _gpt2(config: dict) -> None:
    config.update(architectures=["GPT2LMHeadModel"], model_type="gpt2")


def _truncate(name: str) -> Callable[[str], None]:
    def damage(directory: str) -> None:
        path = os.path.join(directory, name)
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
    return damage


# --- the shared data files ----------------------------------------------------------------------

DOCUMENTS = ("The cat sat on the mat.", "It was warm by the fire.", "A dog ran by the river.",
             "The dog barked at the ducks.", "Rain fell on the town all night.",
             "The river rose over its banks.")


def _jsonl(records) -> str:
    return "".join(json.dumps(record) + "\n" for record in records)


def _npy(array: np.ndarray) -> bytes:
    buffer = io.BytesIO()
    np.save(buffer, array)
    return buffer.getvalue()


def write_files(directory: str) -> None:
    """The small inputs many cases name (none of them is changed by a case)."""
    pos = "good great fine nice lovely superb".split()
    neg = "bad awful poor dull boring weak".split()
    rows = [f"the film was {words[i % 6]} and {words[(i + 1) % 6]}\t{label}"
            for i in range(24) for label, words in ((1, pos), (0, neg))]
    files = {
        "train.tsv": "sentence\tlabel\n" + "\n".join(rows[:32]) + "\n",
        "dev.tsv": "sentence\tlabel\n" + "\n".join(rows[32:]) + "\n",
        "reviews.csv": "text,label\ngood film,1\nbad film,0\n",  # no "sentence" column
        "broken.csv": 'sentence,label\ngood film,1\n"bad film,0\nfine film,1\nnice", 1\nok,0\n',
        "empty.tsv": "",
        "pair.tsv": "Quality\t#1 ID\t#2 ID\t#1 String\n1\t1\t2\tthe cat sat\n0\t3\t4\ta dog\n",
        "pair_three.tsv": "Quality\t#1 String\t#2 String\n1\ta cat\tthe cat\n2\ta dog\tthe dog\n",
        "scores.tsv": "sentence\tlabel\ngood film\t1.5\nbad film\tvery bad\n",
        "tags.conll": "John\tB-PER\nlives\tO\n\nin\nParis\tB-LOC\n",
        "squad_list.json": json.dumps([{"data": []}]),
        "squad_no_answers.json": json.dumps({"data": [{"paragraphs": [{
            "context": "It was founded in 1851.",
            "qas": [{"id": "q1", "question": "When was it founded?"}]}]}]}),
        "squad_garbage.json": GARBAGE,
        "docs.txt": "The cat sat on the mat.\nIt was warm.\n\nA dog ran by the river.\n"
                    "It barked at the ducks.\n",
        "empty.txt": "",
        "binary.txt": b"some text\x00\x00\x01\x02 and then binary\n",
        # Retrieval: a corpus, queries, and the mistakes made with them.
        "docs.jsonl": _jsonl({"id": f"d{i}", "text": text} for i, text in enumerate(DOCUMENTS)),
        "queries.txt": "where did the cat sit\nwho barked at the ducks\n",
        "queries.jsonl": _jsonl([{"id": "q1", "text": "where did the cat sit", "relevant": ["d0"]},
                                 {"id": "q2", "text": "who barked", "relevant": ["d3"]}]),
        "queries_no_relevant.jsonl": _jsonl([{"text": "where did the cat sit"},
                                             {"text": "who barked"}]),
        "queries_unknown_relevant.jsonl": _jsonl([{"id": "q1", "text": "the cat",
                                                   "relevant": ["doc-17"]}]),
        "queries_relevant_not_a_list.jsonl": _jsonl([{"id": "q1", "text": "the cat",
                                                      "relevant": "d0"}]),
        "queries_query_key.jsonl": _jsonl([{"id": "q1", "query": "where did the cat sit"}]),
        # Upper case (a name that differs from the others on a case-insensitive disk too).
        "MY_QUERIES.JSONL": _jsonl([{"id": "q1", "query": "where did the cat sit"}]),
        "queries_duplicate_ids.jsonl": _jsonl([{"id": "q1", "text": "the cat"},
                                               {"id": "q1", "text": "the dog"}]),
        "docs_duplicate_ids.jsonl": _jsonl([{"id": "d1", "text": "a cat"},
                                            {"id": "d1", "text": "a dog"}]),
        "docs_no_id.jsonl": _jsonl([{"text": "a cat"}, {"text": "a dog"}]),
        "docs_blank_text.jsonl": _jsonl([{"id": "d1", "text": "a cat"}, {"id": "d2", "text": " "}]),
        "docs_garbage.jsonl": GARBAGE,
        "empty.jsonl": "",
        "one_line.txt": "The cat sat on the mat.\n",
        "vectors.npy": _npy(np.zeros((2, 4), np.float32)),
    }
    for name, content in files.items():
        _put(os.path.join(directory, name), content)


# --- the catalog --------------------------------------------------------------------------------

def _main(config: str, *args: str) -> tuple[str, ...]:
    return (f"--config={{cfg}}/{config}", *args)


def _pretrain(*overrides: str, workdir: str = "{new}") -> tuple[str, ...]:
    """tiny.py on the shared prepared corpus, so that only the mistake under test can fail."""
    return _main("tiny.py", f"--workdir={workdir}", "--config.data.prepared={corpus}",
                 *(f"--config.{o}" for o in overrides))


def _finetune(config: str, *overrides: str, workdir: str = "{new}",
              init: str = "{pre}") -> tuple[str, ...]:
    """A fine-tuning config started from the shared pretraining run on the shared TSVs."""
    data = ("data.train={files}/train.tsv", "data.eval={files}/dev.tsv")
    given = {o.split("=", 1)[0] for o in overrides}
    settings = [o for o in data if o.split("=", 1)[0] not in given] + list(overrides)
    return _main(f"{config}.py", f"--workdir={workdir}", f"--config.init_checkpoint={init}",
                 *(f"--config.{o}" for o in settings))


def _qa(*overrides: str) -> tuple[str, ...]:
    return _finetune("finetune_qa", "data.train={files}/squad_list.json",
                     "data.eval={files}/squad_list.json", *overrides)


def _predict(config: str, workdir: str, *overrides: str) -> tuple[str, ...]:
    return _main(f"{config}.py", f"--workdir={workdir}", "--config.mode=predict",
                 *(f"--config.{o}" for o in overrides))


def _prepare(*args: str, output: str = "{new}") -> tuple[str, ...]:
    return ("--output", output, "--workers", "1", "--no-progress", *args)


MAIN, PREPARE, INSPECT = "main", "data.prepare", "data.inspect"
EXPORT, CONVERT, BENCH = "export", "convert", "bench"
INDEX, EMBED, EVALUATE = "index", "embed", "evaluate"
WSD = "wsd"  # `python -m bertjax.wsd` (test_catalog.py tells cli_in_process its module)

# A second mistake, found later than the one under test: a case whose setting is not refused
# yet stops at this file instead of training for minutes (settings are checked before any file).
NO_TRAIN_FILE = "data.train={tmp}/missing.tsv"


def _distill(*overrides: str, workdir: str = "{new}") -> tuple[str, ...]:
    """configs/distill.py: a student of the shared fine-tuned run on the shared TSVs."""
    defaults = ("distill.teacher={ft}", "data.train={files}/train.tsv",
                "data.eval={files}/dev.tsv", "data.max_seq_len=32")
    given = {o.split("=", 1)[0] for o in overrides}
    settings = [o for o in defaults if o.split("=", 1)[0] not in given] + list(overrides)
    return _main("distill.py", f"--workdir={workdir}", *(f"--config.{o}" for o in settings))


def _method(*overrides: str) -> tuple[str, ...]:
    """finetune_sentiment.py with another finetune.method (configs/finetune_base.py's keys)."""
    return _finetune("finetune_sentiment", *overrides)


def _build(*args: str, model: str = "{pre}", corpus: str = "{files}/docs.jsonl",
           output: str = "{new}") -> tuple[str, ...]:
    return ("build", "--model", model, "--corpus", corpus, "--output", output, *args)


def _search(*args: str, index: str = "{index}", queries: str = "{files}/queries.txt"
            ) -> tuple[str, ...]:
    return ("search", "--index", index, "--queries", queries, *args)


def _rank(*args: str, index: str = "{index}", queries: str = "{files}/queries.jsonl"
          ) -> tuple[str, ...]:
    """`index evaluate`."""
    return ("evaluate", "--index", index, "--queries", queries, *args)


def _embed(*args: str, model: str = "{pre}", input: str = "{files}/docs.txt",
           output: str = "{tmp}/vectors.npy") -> tuple[str, ...]:
    return ("--model", model, "--input", input, "--output", output, *args)


def _fit(*args: str, model: str = "{pre}", corpus: str = "{files}/docs.txt",
         output: str = "{tmp}/stats.npz") -> tuple[str, ...]:
    """`embed --fit-standardizer`."""
    return ("--model", model, "--fit-standardizer", corpus, "--output", output, *args)


def _predict_sense(*args: str, index: str = "{senses}") -> tuple[str, ...]:
    return ("predict", "--index", index, "--sentence", "The bank of the river was steep.",
            "--word", "bank", *args)


def _manifest(edit: Callable[[dict], None]) -> Callable[[str], None]:
    return _edit_json("manifest.json", edit)


def _model_moved(directory: str) -> None:
    _manifest(lambda m: m["model"].update(path=os.path.join(directory, "gone")))(directory)


def _put_text(name: str, content: str | bytes) -> Callable[[str], None]:
    return lambda directory: _put(os.path.join(directory, name), content)

CASES = [
    # --- python -m bertjax.main, pretraining configs ------------------------------------------
    Case("main-pretrain-unknown-key", MAIN, _pretrain("train.stpes=10"),
         "unknown config key"),
    Case("main-pretrain-unknown-section-key", MAIN, _pretrain("optimizer.lr=0.001"),
         "unknown config key"),
    Case("main-pretrain-negative-steps", MAIN, _pretrain("train.steps=-5"),
         "train.steps must be positive"),
    Case("main-pretrain-steps-not-a-number", MAIN, _pretrain("train.steps=many"),
         "bad flags or config"),
    Case("main-pretrain-seq-len-over-model-limit", MAIN, _pretrain("schedule.long_seq_len=1024"),
         "exceeds model.max_position_embeddings 512"),
    Case("main-pretrain-hidden-not-divisible-by-heads", MAIN,
         _pretrain("model.hidden_size=100", "model.num_heads=3"), "not divisible"),
    Case("main-pretrain-unknown-preset", MAIN, _pretrain("model.preset=gigantic"), "gigantic"),
    Case("main-pretrain-unknown-objective", MAIN, _pretrain("objective=xlnet"),
         "unknown objective 'xlnet'"),
    Case("main-pretrain-unknown-masking", MAIN, _pretrain("masking.strategy=random"),
         "masking.strategy"),
    Case("main-pretrain-mesh-larger-than-devices", MAIN, _pretrain("mesh.data=4"), "devices"),
    Case("main-pretrain-mesh-spans-more-devices-than-there-are", MAIN, _pretrain("mesh.devices=9"),
         "mesh.devices=9: there are 8 devices"),
    Case("main-pretrain-does-not-fit-device-memory", MAIN,
         _pretrain("train.device_memory_gb=0.001", "train.fit=off"),
         "per device but a device holds"),
    Case("main-pretrain-unknown-fit", MAIN, _pretrain("train.fit=on"),
         "train.fit must be one of auto, off, got 'on'"),
    Case("main-pretrain-from-checkpoint-without-init", MAIN,
         _pretrain("model.preset=from_checkpoint"), "init_checkpoint"),
    Case("main-pretrain-init-checkpoint-not-a-model", MAIN,
         _pretrain("init_checkpoint={files}"), "is not a model"),
    Case("main-pretrain-vocab-size-disagrees-with-corpus", MAIN,
         _pretrain("data.vocab_size=500"), "not the 500"),
    Case("main-pretrain-config-file-missing", MAIN,
         ("--config={tmp}/nope.py", "--workdir={new}"), "config file not found"),
    Case("main-pretrain-no-workdir", MAIN, _main("tiny.py"), "--workdir is required"),
    Case("main-pretrain-workdir-is-a-file", MAIN, _pretrain(workdir="{files}/docs.txt"),
         "not a directory"),
    Case("main-pretrain-input-missing", MAIN,
         _main("tiny.py", "--workdir={new}", "--config.data.input={tmp}/corpus/*.txt"),
         "no file matches"),
    Case("main-pretrain-input-empty", MAIN,
         _main("tiny.py", "--workdir={new}", "--config.data.input={files}/empty.txt"),
         "empty"),
    Case("main-pretrain-unknown-input-format", MAIN,
         _main("tiny.py", "--workdir={new}", "--config.data.input={files}/docs.txt",
               "--config.data.input_format=xml"), "xml"),
    Case("main-pretrain-on-a-finetuning-workdir", MAIN, _pretrain(workdir="{ft}"),
         "holds a run with task="),
    Case("main-pretrain-corrupt-run-json", MAIN, _pretrain(workdir="{tmp}/wd"), "run.json",
         setup=_copy("pre", _garbage("run.json"))),
    Case("main-base-no-corpus", MAIN, _main("base.py", "--workdir={new}"), "no corpus"),
    Case("main-large-heads-do-not-divide-hidden", MAIN,
         _main("large.py", "--workdir={new}", "--config.model.num_heads=7"), "not divisible"),
    Case("main-roberta-seq-len-over-model-limit", MAIN,
         _main("roberta.py", "--workdir={new}", "--config.schedule.long_seq_len=600",
               "--config.schedule.short_seq_len=600"), "exceeds"),
    Case("main-spanbert-token-masking", MAIN,
         _main("spanbert.py", "--workdir={new}", "--config.masking.strategy=token"),
         "masking.strategy='span'"),
    Case("main-demo-unknown-key", MAIN,
         _main("demo.py", "--workdir={new}", "--config.train.epochs=3"), "unknown config key"),
    Case("main-platform-unknown-preset", MAIN,
         _main("platform.py:tpu_v9", "--workdir={new}"), "tpu_v9"),

    # --- python -m bertjax.main, fine-tuning configs (train mode) -----------------------------
    Case("main-sentiment-duplicate-labels", MAIN,
         _finetune("finetune_sentiment", "data.labels=0,1,1"), "data.labels lists 1 twice"),
    Case("main-sentiment-csv-unknown-column", MAIN,
         _finetune("finetune_sentiment", "data.train={files}/reviews.csv",
                   "data.eval={files}/reviews.csv"), "no column 'sentence'"),
    Case("main-sentiment-csv-unterminated-quote", MAIN,
         _finetune("finetune_sentiment", "data.train={files}/broken.csv"), "unterminated quote"),
    Case("main-sentiment-train-file-missing", MAIN,
         _finetune("finetune_sentiment", "data.train={tmp}/train.tsv"), "data file not found"),
    Case("main-sentiment-train-file-empty", MAIN,
         _finetune("finetune_sentiment", "data.train={files}/empty.tsv"), "no examples in"),
    Case("main-sentiment-unknown-format", MAIN,
         _finetune("finetune_sentiment", "data.format=xlsx"), "data.format must be one of"),
    Case("main-sentiment-positive-label-not-a-label", MAIN,
         _finetune("finetune_sentiment", "data.labels=neg,pos", "data.positive_label=1"),
         "data.positive_label"),
    Case("main-sentiment-unknown-key", MAIN,
         _finetune("finetune_sentiment", "data.text_colum=text"), "unknown config key"),
    Case("main-sentiment-unknown-mode", MAIN,
         _finetune("finetune_sentiment", "mode=evaluate"), "mode must be one of"),
    Case("main-sentiment-unknown-task", MAIN,
         _finetune("finetune_sentiment", "task=finetune_summarization"),
         "finetune_summarization"),
    Case("main-sentiment-init-checkpoint-missing", MAIN,
         _finetune("finetune_sentiment", init="{tmp}/nowhere"), "checkpoint not found"),
    Case("main-sentiment-seq-len-over-model-limit", MAIN,
         _finetune("finetune_sentiment", "data.max_seq_len=1024"), "max_position_embeddings"),
    Case("main-sentiment-on-a-pretraining-workdir", MAIN,  # every example truncated: noted?
         _finetune("finetune_sentiment", "data.max_seq_len=8", workdir="{pre}"),
         "holds a run with task="),
    Case("main-sentiment-corrupt-run-json", MAIN,
         _finetune("finetune_sentiment", workdir="{tmp}/wd"), "run.json",
         setup=_copy("ft", _garbage("run.json"))),
    Case("main-regression-on-a-classification-workdir", MAIN,
         _finetune("finetune_regression", workdir="{ft}"), "holds a run with task="),
    Case("main-regression-label-not-a-number", MAIN,
         _finetune("finetune_regression", "data.train={files}/scores.tsv"), "is not a number"),
    Case("main-pair-missing-second-column", MAIN,
         _finetune("finetune_pair", "data.train={files}/pair.tsv", "data.eval={files}/pair.tsv"),
         "no column '#2 String'"),
    Case("main-pair-label-outside-labels", MAIN,
         _finetune("finetune_pair", "data.train={files}/pair_three.tsv",
                   "data.eval={files}/pair_three.tsv"), "'2'"),
    Case("main-ner-tag-missing", MAIN,
         _finetune("finetune_ner", "data.train={files}/tags.conll",
                   "data.eval={files}/tags.conll"), "the tag is missing"),
    Case("main-ner-table-instead-of-conll", MAIN, _finetune("finetune_ner"),
         "cannot hold this task's examples"),
    Case("main-qa-squad-is-a-list", MAIN, _qa(), "the top level is a JSON list"),
    Case("main-qa-squad-answers-missing", MAIN,
         _qa("data.train={files}/squad_no_answers.json"), 'has no "answers"'),
    Case("main-qa-squad-not-json", MAIN, _qa("data.train={files}/squad_garbage.json"),
         "squad_garbage.json"),
    Case("main-qa-no-room-for-the-context", MAIN,
         _qa("data.max_seq_len=60", "data.max_query_length=64"), "leaves no room"),

    # --- python -m bertjax.main, fine-tuning configs (predict mode) ---------------------------
    Case("main-predict-untrained-new-workdir", MAIN,
         _predict("finetune_sentiment", "{new}", "data.predict={files}/dev.tsv"),
         "holds no fine-tuning run"),
    Case("main-predict-on-a-pretraining-workdir", MAIN,
         _predict("finetune_sentiment", "{pre}", "data.predict={files}/dev.tsv"),
         "holds no fine-tuning run"),
    Case("main-predict-task-differs", MAIN,
         _predict("finetune_regression", "{ft}", "data.predict={files}/dev.tsv"),
         "the config says finetune_regression"),
    Case("main-predict-output-exists", MAIN,
         _predict("finetune_sentiment", "{ft}", "data.predict={files}/dev.tsv",
                  "predict_output={tmp}/predictions.jsonl"), "exists",
         setup=_write("predictions.jsonl", '{"id": "1", "label": "0"}\n')),
    Case("main-predict-file-missing", MAIN,
         _predict("finetune_sentiment", "{ft}", "data.predict={tmp}/new.tsv"),
         "data file not found"),
    Case("main-predict-unfinished-run-file-missing", MAIN,
         _predict("finetune_sentiment", "{tmp}/wd", "data.predict={tmp}/new.tsv"),
         "data file not found", setup=_copy("ft", _remove("results.json"))),
    Case("main-predict-without-a-file", MAIN, _predict("finetune_ner", "{ft}"),
         "predict mode needs"),

    # --- python -m bertjax.data.prepare --------------------------------------------------------
    Case("prepare-input-missing", PREPARE, _prepare("--input", "{tmp}/corpus.txt"),
         "input not found"),
    Case("prepare-input-empty", PREPARE, _prepare("--input", "{files}/empty.txt",
                                                  "--vocab-size", "100"), "empty"),
    Case("prepare-input-binary", PREPARE, _prepare("--input", "{files}/binary.txt",
                                                   "--vocab-size", "100"), "looks binary"),
    Case("prepare-unknown-format", PREPARE, _prepare("--input", "{files}/docs.txt",
                                                     "--format", "xml"), "invalid choice"),
    Case("prepare-unknown-tokenizer-kind", PREPARE,
         _prepare("--input", "{files}/docs.txt", "--train-vocab", "unigram"), "invalid choice"),
    Case("prepare-negative-vocab-size", PREPARE,
         _prepare("--input", "{files}/docs.txt", "--vocab-size", "-5"), "-5"),
    Case("prepare-vocab-missing", PREPARE,
         _prepare("--input", "{files}/docs.txt", "--vocab", "{tmp}/vocab.txt"), "vocab.txt"),
    Case("prepare-zero-workers", PREPARE,
         ("--input", "{files}/docs.txt", "--output", "{new}", "--vocab-size", "100",
          "--workers", "0", "--no-progress"), "workers must be positive"),
    Case("prepare-zero-max-line-chars", PREPARE,
         _prepare("--input", "{files}/docs.txt", "--vocab-size", "100", "--max-line-chars", "0"),
         "max_line_chars"),
    Case("prepare-output-is-a-file", PREPARE,
         _prepare("--input", "{files}/docs.txt", "--vocab-size", "100",
                  output="{tmp}/prepared"), "prepared",
         setup=_write("prepared", "not a directory\n")),
    Case("prepare-output-holds-other-files", PREPARE,
         _prepare("--input", "{files}/docs.txt", "--vocab-size", "100", output="{files}"),
         "holds no preparation"),
    Case("prepare-again-vocab-size-disagrees", PREPARE,
         _prepare("--input", "{files}/docs.txt", "--vocab-size", "500", output="{corpus}"),
         "not the 500"),
    Case("prepare-again-cased-over-uncased", PREPARE,
         _prepare("--input", "{files}/docs.txt", "--cased", output="{corpus}"), "uncased"),
    Case("prepare-again-input-missing", PREPARE,
         _prepare("--input", "{tmp}/corpus.txt", output="{corpus}"), "input not found"),

    # --- python -m bertjax.data.inspect --------------------------------------------------------
    Case("inspect-finetuning-config", INSPECT,
         _main("finetune_sentiment.py", "--workdir={new}"), "takes a pretraining config"),
    Case("inspect-finetuning-config-without-workdir", INSPECT, _main("finetune_ner.py"),
         "takes a pretraining config"),
    Case("inspect-dump-exists", INSPECT,
         _main("tiny.py", "--workdir={new}", "--config.data.prepared={corpus}",
               "--dump={tmp}/batches.npz"), "already exists",
         setup=_write("batches.npz", b"an earlier inspection")),
    Case("inspect-dump-directory-missing", INSPECT,
         _main("tiny.py", "--workdir={new}", "--config.data.prepared={corpus}",
               "--dump={tmp}/out/batches.npz"), "is not a directory"),
    Case("inspect-zero-batches", INSPECT,
         _main("tiny.py", "--workdir={new}", "--config.data.prepared={corpus}", "--batches=0"),
         "--batches must be positive"),
    Case("inspect-no-workdir", INSPECT, _main("tiny.py"), "--workdir is required"),
    Case("inspect-unknown-key", INSPECT,
         _main("tiny.py", "--workdir={new}", "--config.data.prepard={corpus}"), "prepard"),
    Case("inspect-no-corpus", INSPECT, _main("tiny.py", "--workdir={new}"), "no corpus"),
    Case("inspect-config-file-missing", INSPECT, ("--config={tmp}/nope.py", "--workdir={new}"),
         "nope.py"),

    # --- python -m bertjax.export --------------------------------------------------------------
    Case("export-workdir-without-checkpoints", EXPORT,
         ("--workdir", "{tmp}/wd", "--format", "params", "--output", "{new}"),
         "has no checkpoint", setup=_copy("pre", _stopped_before_a_checkpoint)),
    Case("export-output-exists", EXPORT,
         ("--workdir", "{pre}", "--format", "hf", "--output", "{tmp}/out"), "already exists",
         setup=_write("out/config.json", "{}\n")),
    Case("export-unknown-format", EXPORT,
         ("--workdir", "{pre}", "--format", "onnx", "--output", "{new}"), "invalid choice"),
    Case("export-step-missing", EXPORT,
         ("--workdir", "{pre}", "--format", "params", "--step", "4", "--output", "{new}"),
         "no checkpoint of step 4"),
    Case("export-source-missing", EXPORT,
         ("--workdir", "{tmp}/nowhere", "--format", "params", "--output", "{new}"),
         "checkpoint not found"),
    Case("export-corrupt-run-json", EXPORT,
         ("--workdir", "{tmp}/wd", "--format", "hf", "--output", "{new}"), "run.json",
         setup=_copy("pre", _garbage("run.json"))),
    Case("export-step-of-a-params-export", EXPORT,
         ("--workdir", "{params}", "--format", "hf", "--step", "6", "--output", "{new}"),
         "not a workdir"),
    Case("export-tokenizer-missing", EXPORT,
         ("--workdir", "{pre}", "--format", "hf", "--tokenizer", "{tmp}/vocab.txt",
          "--output", "{new}"), "vocab.txt"),
    Case("export-over-its-own-source", EXPORT,
         ("--workdir", "{pre}", "--format", "params", "--output", "{pre}", "--overwrite"),
         "would replace the input"),

    # --- python -m bertjax.convert -------------------------------------------------------------
    Case("convert-a-workdir-not-a-bert", CONVERT, ("--from-hf", "{pre}", "--output", "{new}"),
         "is not a Hugging Face BERT checkpoint"),
    Case("convert-output-exists", CONVERT, ("--from-hf", "{hf}", "--output", "{tmp}/out"),
         "already exists", setup=_write("out/bertjax.json", "{}\n")),
    Case("convert-another-architecture", CONVERT, ("--from-hf", "{tmp}/wd", "--output", "{new}"),
         "unsupported model_type 'gpt2'", setup=_copy("hf", _edit_json("config.json", _gpt2))),
    Case("convert-config-not-json", CONVERT, ("--from-hf", "{tmp}/wd", "--output", "{new}"),
         "config.json", setup=_copy("hf", _garbage("config.json"))),
    Case("convert-truncated-weights", CONVERT, ("--from-hf", "{tmp}/wd", "--output", "{new}"),
         "model.safetensors", setup=_copy("hf", _truncate("model.safetensors"))),
    Case("convert-no-weights", CONVERT, ("--from-hf", "{tmp}/wd", "--output", "{new}"),
         "has no weights", setup=_copy("hf", _remove("model.safetensors"))),

    # --- python -m bertjax.bench ---------------------------------------------------------------
    Case("bench-zero-batch", BENCH, _main("tiny.py", "--batch", "0"), "--batch"),
    Case("bench-seq-len-too-short", BENCH, _main("tiny.py", "--seq-len", "4"), "--seq-len"),
    Case("bench-steps-not-a-number", BENCH, _main("tiny.py", "--steps", "many"), "many"),
    Case("bench-unknown-flag", BENCH, _main("tiny.py", "--fast"), "--fast"),
    Case("bench-no-config", BENCH, ("--batch", "2"), "--config is required"),
    Case("bench-unknown-key", BENCH, _main("tiny.py", "--config.train.bogus=1"),
         "unknown config key"),
    Case("bench-json-directory-missing", BENCH,
         _main("tiny.py", "--json", "{tmp}/out/bench.json"), "does not exist"),
    Case("bench-json-is-a-directory", BENCH, _main("tiny.py", "--json", "{tmp}"),
         "is a directory"),
    Case("bench-seq-len-over-model-limit", BENCH,
         _main("tiny.py", "--seq-len", "1024", "--batch", "1", "--steps", "1", "--warmup", "0"),
         "1024"),
    Case("bench-finetuning-config", BENCH, _main("finetune_sentiment.py"),
         "takes a pretraining config"),
    Case("bench-config-file-missing", BENCH, ("--config={tmp}/nope.py",), "config file not found"),

    # --- python -m bertjax.index build --------------------------------------------------------
    Case("index-build-corpus-missing", INDEX, _build(corpus="{tmp}/docs.jsonl"), "file not found"),
    Case("index-build-corpus-empty", INDEX, _build(corpus="{files}/empty.jsonl"), "is empty"),
    Case("index-build-corpus-garbage", INDEX, _build(corpus="{files}/docs_garbage.jsonl"),
         "cannot read"),
    Case("index-build-corpus-plain-text", INDEX, _build(corpus="{files}/docs.txt"),
         "line 1: not JSON"),
    Case("index-build-corpus-is-an-npy", INDEX, _build(corpus="{files}/vectors.npy"),
         "cannot read"),
    Case("index-build-corpus-is-a-directory", INDEX, _build(corpus="{files}"), "cannot read"),
    Case("index-build-corpus-duplicate-ids", INDEX,
         _build(corpus="{files}/docs_duplicate_ids.jsonl"), "duplicate document id 'd1'"),
    Case("index-build-corpus-without-ids", INDEX, _build(corpus="{files}/docs_no_id.jsonl"),
         'line 1: no "id"'),
    Case("index-build-corpus-blank-text", INDEX, _build(corpus="{files}/docs_blank_text.jsonl"),
         'line 2: no "text"'),
    Case("index-build-model-not-a-model", INDEX, _build(model="{files}"), "is not a model"),
    Case("index-build-model-missing", INDEX, _build(model="{tmp}/nowhere"),
         "checkpoint not found"),
    Case("index-build-model-is-an-index", INDEX, _build(model="{index}"), "is not a model"),
    Case("index-build-unknown-pooling", INDEX, _build("--pooling", "average"), "average"),
    Case("index-build-batch-size-zero", INDEX, _build("--batch-size", "0"),
         "--batch-size must be at least 1"),
    Case("index-build-output-exists", INDEX, _build(output="{index}"), "already exists"),
    Case("index-build-overwrite-a-file", INDEX,
         _build("--overwrite", output="{tmp}/notes.txt"), "--overwrite replaces only",
         setup=_write("notes.txt", "my notes\n")),
    Case("index-build-overwrite-a-finetuning-workdir", INDEX,
         _build("--overwrite", output="{tmp}/wd"), "--overwrite replaces only",
         setup=_copy("ft")),
    Case("index-build-overwrite-its-own-corpus", INDEX,
         _build("--overwrite", corpus="{tmp}/wd/documents.jsonl", output="{tmp}/wd"),
         "would replace the input", setup=_copy("index")),
    Case("index-build-standardize-missing", INDEX, _build("--standardize", "{tmp}/stats.npz"),
         "statistics file not found"),
    Case("index-build-standardize-garbage", INDEX, _build("--standardize", "{tmp}/stats.npz"),
         "stats.npz", setup=_write("stats.npz", GARBAGE)),
    Case("index-build-standardize-other-pooling", INDEX,
         _build("--pooling", "cls", "--standardize", "{stats}/mean.npz"),
         "the statistics are of mean pooling, not cls"),
    Case("index-build-standardize-other-model", INDEX,
         _build("--standardize", "{stats}/mean.npz", model="{ft}"),
         "the statistics are of another model"),

    # --- python -m bertjax.index search -------------------------------------------------------
    Case("index-no-command", INDEX, (), "required"),
    Case("index-unknown-command", INDEX, ("query", "--index", "{index}"), "invalid choice"),
    Case("index-search-index-missing", INDEX, _search(index="{tmp}/nowhere"),
         "is not a bertjax index"),
    Case("index-search-index-is-a-workdir", INDEX, _search(index="{pre}"),
         "is not a bertjax index"),
    Case("index-search-index-is-a-sense-index", INDEX, _search(index="{senses}"),
         "is not a bertjax index"),
    Case("index-search-index-is-a-file", INDEX, _search(index="{files}/docs.jsonl"),
         "is not a bertjax index"),
    Case("index-search-garbage-manifest", INDEX, _search(index="{tmp}/wd"), "is damaged",
         setup=_copy("index", _garbage("manifest.json"))),
    Case("index-search-manifest-without-dim", INDEX, _search(index="{tmp}/wd"), "is damaged",
         setup=_copy("index", _manifest(lambda m: m.pop("dim")))),
    Case("index-search-manifest-without-model", INDEX, _search(index="{tmp}/wd"), "is damaged",
         setup=_copy("index", _manifest(lambda m: m.pop("model")))),
    Case("index-search-manifest-without-pooling", INDEX, _search(index="{tmp}/wd"),
         "is damaged", setup=_copy("index", _manifest(lambda m: m.pop("pooling")))),
    Case("index-search-truncated-vectors", INDEX, _search(index="{tmp}/wd"), "is damaged",
         setup=_copy("index", _truncate("vectors.npy"))),
    Case("index-search-documents-missing", INDEX, _search(index="{tmp}/wd"), "is damaged",
         setup=_copy("index", _remove("documents.jsonl"))),
    Case("index-search-approximate-truncated-hnsw", INDEX,
         _search("--approximate", index="{tmp}/wd"), "is damaged",
         setup=_copy("index", _truncate("hnsw.faiss"))),
    Case("index-search-approximate-garbage-hnsw", INDEX,
         _search("--approximate", index="{tmp}/wd"), "is damaged",
         setup=_copy("index", _garbage("hnsw.faiss"))),
    Case("index-search-approximate-without-hnsw", INDEX,
         _search("--approximate", index="{tmp}/wd"), "has no approximate index",
         setup=_copy("index", _manifest(lambda m: m.update(approximate=None)))),
    Case("index-search-model-gone", INDEX, _search(index="{tmp}/wd"), "is gone",
         setup=_copy("index", _model_moved)),
    Case("index-search-k-zero", INDEX, _search("--k", "0"), "--k must be at least 1"),
    Case("index-search-k-negative", INDEX, _search("--k", "-3"), "--k must be at least 1"),
    Case("index-search-k-not-an-integer", INDEX, _search("--k", "2.5"), "invalid int value"),
    Case("index-search-queries-missing", INDEX, _search(queries="{tmp}/queries.txt"),
         "file not found"),
    Case("index-search-queries-empty", INDEX, _search(queries="{files}/empty.txt"), "is empty"),
    Case("index-search-queries-is-an-npy", INDEX, _search(queries="{files}/vectors.npy"),
         "cannot read"),
    Case("index-search-queries-is-a-directory", INDEX, _search(queries="{files}"),
         "cannot read"),
    Case("index-search-queries-jsonl-not-json", INDEX, _search(queries="{tmp}/queries.jsonl"),
         "line 1: not JSON", setup=_write("queries.jsonl", "where did the cat sit\n")),
    Case("index-search-queries-without-text", INDEX,
         _search(queries="{files}/queries_query_key.jsonl"), 'no "text"'),
    Case("index-search-upper-case-jsonl-without-text", INDEX,
         _search(queries="{files}/MY_QUERIES.JSONL"), 'no "text"'),
    Case("index-search-duplicate-query-ids", INDEX,
         _search(queries="{files}/queries_duplicate_ids.jsonl"), "duplicate query id 'q1'"),
    Case("index-search-exact-and-approximate", INDEX, _search("--exact", "--approximate"),
         "not allowed with"),
    Case("index-search-model-not-a-model", INDEX, _search("--model", "{files}"),
         "is not a model"),
    Case("index-search-model-of-another-run", INDEX, _search("--model", "{ft}"),
         "an index built by another model"),
    Case("index-search-standardize-not-built-with", INDEX,
         _search("--standardize", "{stats}/mean.npz"), "without standardisation"),
    Case("index-search-batch-size-zero", INDEX, _search("--batch-size", "0"),
         "--batch-size must be at least 1"),
    Case("index-search-rerank-single-sentence-classifier", INDEX, _search("--rerank", "{ft}"),
         "pair classifier"),
    Case("index-search-rerank-pretraining-run", INDEX, _search("--rerank", "{pre}"),
         "is not a fine-tuned classification run"),
    Case("index-search-rerank-k-zero", INDEX, _search("--rerank", "{ft}", "--rerank-k", "0"),
         "--rerank-k must be at least 1"),
    Case("index-search-rerank-k-below-k", INDEX,
         _search("--rerank", "{ft}", "--k", "10", "--rerank-k", "5"),
         "--rerank-k (5) must be at least --k (10)"),
    Case("index-search-output-exists", INDEX, _search("--output", "{tmp}/results.jsonl"),
         "already exists", setup=_write("results.jsonl", '{"id": "1", "results": []}\n')),
    Case("index-search-output-is-the-queries", INDEX,
         _search("--output", "{tmp}/q.txt", "--overwrite", queries="{tmp}/q.txt"),
         "would replace the input", setup=_write("q.txt", "where did the cat sit\n")),
    Case("index-search-output-inside-the-index", INDEX,
         _search("--output", "{tmp}/wd/results.jsonl", index="{tmp}/wd"),
         "would be written inside the input",
         setup=_copy("index")),
    Case("index-search-output-directory-missing", INDEX,
         _search("--output", "{tmp}/out/results.jsonl"), "is not an existing directory"),

    # --- python -m bertjax.index evaluate -----------------------------------------------------
    Case("index-evaluate-txt-queries", INDEX, _rank(queries="{files}/queries.txt"),
         "evaluation needs a .jsonl query file"),
    Case("index-evaluate-queries-without-ids-or-relevant", INDEX,
         _rank(queries="{files}/queries_no_relevant.jsonl"), 'no "relevant" document ids'),
    Case("index-evaluate-relevant-not-in-the-index", INDEX,
         _rank(queries="{files}/queries_unknown_relevant.jsonl"), "'doc-17'"),
    Case("index-evaluate-relevant-not-a-list", INDEX,
         _rank(queries="{files}/queries_relevant_not_a_list.jsonl"),
         '"relevant" must be a non-empty list'),
    Case("index-evaluate-k-flag", INDEX, _rank("--k", "5"), "unrecognized arguments: --k"),
    Case("index-evaluate-bm25-garbage-manifest", INDEX, _rank("--bm25", index="{tmp}/wd"),
         "is damaged", setup=_copy("index", _garbage("manifest.json"))),
    Case("index-evaluate-truncated-hnsw", INDEX, _rank(index="{tmp}/wd"), "is damaged",
         setup=_copy("index", _truncate("hnsw.faiss"))),
    Case("index-evaluate-rerank-single-sentence-classifier", INDEX, _rank("--rerank", "{ft}"),
         "pair classifier"),
    Case("index-evaluate-rerank-k-zero", INDEX, _rank("--rerank", "{ft}", "--rerank-k", "0"),
         "--rerank-k must be at least 1"),
    Case("index-evaluate-standardize-garbage", INDEX, _rank("--standardize", "{files}/docs.txt"),
         "docs.txt"),

    # --- python -m bertjax.embed --------------------------------------------------------------
    Case("embed-input-missing", EMBED, _embed("--pooling", "mean", input="{tmp}/texts.txt"),
         "input file not found"),
    Case("embed-input-empty", EMBED, _embed("--pooling", "mean", input="{files}/empty.txt"),
         "has no text"),
    Case("embed-input-is-an-npy", EMBED,
         _embed("--pooling", "mean", input="{files}/vectors.npy"), "is not UTF-8 text"),
    Case("embed-input-is-a-directory", EMBED, _embed("--pooling", "mean", input="{files}"),
         "cannot read"),
    Case("embed-no-pooling", EMBED, _embed(), "--pooling is required"),
    Case("embed-unknown-pooling", EMBED, _embed("--pooling", "average"), "invalid choice"),
    Case("embed-model-not-a-model", EMBED, _embed("--pooling", "mean", model="{files}"),
         "is not a model"),
    Case("embed-model-is-an-index", EMBED, _embed("--pooling", "mean", model="{index}"),
         "is not a model"),
    Case("embed-output-exists", EMBED, _embed("--pooling", "mean"), "already exists",
         setup=_write("vectors.npy", _npy(np.ones((1, 2), np.float32)))),
    Case("embed-output-is-the-input", EMBED,
         _embed("--pooling", "mean", "--overwrite", input="{tmp}/texts.txt",
                output="{tmp}/texts.txt"), "would replace the input",
         setup=_write("texts.txt", "a cat\na dog\n")),
    Case("embed-output-is-a-directory", EMBED, _embed("--pooling", "mean", output="{tmp}"),
         "is a directory"),
    Case("embed-output-directory-missing", EMBED,
         _embed("--pooling", "mean", output="{tmp}/out/vectors.npy"),
         "is not an existing directory"),
    Case("embed-bad-layers", EMBED, _embed("--pooling", "mean", "--layers", "last"),
         "--layers 'last'"),
    Case("embed-layer-out-of-range", EMBED, _embed("--pooling", "mean", "--layers", "99"),
         "layer 99 does not exist"),
    Case("embed-batch-size-zero", EMBED, _embed("--pooling", "mean", "--batch-size", "0"),
         "batch_size must be an integer of at least 1, got 0"),
    Case("embed-standardize-other-pooling", EMBED,
         _embed("--pooling", "cls", "--standardize", "{stats}/mean.npz"),
         "the statistics are of mean pooling, not cls"),
    Case("embed-standardize-other-model", EMBED,
         _embed("--pooling", "mean", "--standardize", "{stats}/mean.npz", model="{ft}"),
         "the statistics are of another model"),
    Case("embed-standardize-other-layers", EMBED,
         _embed("--pooling", "mean", "--layers", "-1", "--standardize", "{stats}/mean.npz"),
         "the statistics are of layers"),
    Case("embed-standardize-text-file", EMBED,
         _embed("--pooling", "mean", "--standardize", "{files}/docs.txt"),
         "is not a readable statistics file"),
    Case("embed-standardize-is-an-npy", EMBED,
         _embed("--pooling", "mean", "--standardize", "{files}/vectors.npy"),
         "is not a bertjax statistics file"),
    Case("embed-input-and-fit-standardizer", EMBED,
         _fit("--input", "{files}/docs.txt", "--pooling", "mean"), "not allowed with"),
    Case("embed-fit-standardizer-without-pooling", EMBED, _fit(),
         "--fit-standardizer needs --pooling"),
    Case("embed-fit-standardizer-output-not-npz", EMBED,
         _fit("--pooling", "mean", output="{tmp}/stats.npy"), "give --output a .npz name"),
    Case("embed-fit-standardizer-output-exists", EMBED,
         _fit("--pooling", "mean", output="{stats}/mean.npz"), "already exists"),
    Case("embed-fit-standardizer-corpus-missing", EMBED,
         _fit("--pooling", "mean", corpus="{tmp}/corpus.txt"), "input file not found"),
    Case("embed-fit-standardizer-corpus-empty", EMBED,
         _fit("--pooling", "mean", corpus="{files}/empty.txt"), "has no text"),
    Case("embed-fit-standardizer-one-sentence", EMBED,
         _fit("--pooling", "mean", corpus="{files}/one_line.txt"),
         "at least 2 reference vectors"),
    Case("embed-fit-standardizer-too-many-components", EMBED,
         _fit("--pooling", "mean", "--method", "all-but-the-top", "--components", "1000"),
         "all-but-the-top removes between 1 and"),
    Case("embed-fit-standardizer-with-normalize", EMBED, _fit("--pooling", "mean", "--normalize"),
         "--standardize and --normalize go with --input"),
    Case("embed-components-without-fit", EMBED, _embed("--pooling", "mean", "--components", "2"),
         "go with --fit-standardizer"),

    # --- python -m bertjax.evaluate -----------------------------------------------------------
    Case("evaluate-no-subcommand", EVALUATE, (), "no subcommand given"),
    Case("evaluate-unknown-subcommand", EVALUATE, ("sts", "--model", "{pre}"),
         "unknown subcommand 'sts'"),
    Case("evaluate-similarity-model-not-a-model", EVALUATE,
         ("similarity", "--model", "{files}"), "is not a model"),
    Case("evaluate-similarity-model-is-an-index", EVALUATE,
         ("similarity", "--model", "{index}"), "is not a model"),
    Case("evaluate-similarity-unknown-pooling", EVALUATE,
         ("similarity", "--model", "{pre}", "--pooling", "mean", "average"), "invalid choice"),
    Case("evaluate-similarity-standardize-missing", EVALUATE,
         ("similarity", "--model", "{pre}", "--standardize", "{tmp}/stats.npz"),
         "statistics file not found"),
    Case("evaluate-similarity-standardize-other-pooling", EVALUATE,
         ("similarity", "--model", "{pre}", "--pooling", "cls", "--standardize",
          "{stats}/mean.npz"), "the statistics are of mean pooling, not cls"),
    Case("evaluate-anisotropy-no-corpus", EVALUATE, ("anisotropy", "--model", "{pre}"),
         "--corpus"),
    Case("evaluate-anisotropy-corpus-missing", EVALUATE,
         ("anisotropy", "--model", "{pre}", "--corpus", "{tmp}/corpus.txt"),
         "input file not found"),
    Case("evaluate-anisotropy-corpus-is-an-npy", EVALUATE,
         ("anisotropy", "--model", "{pre}", "--corpus", "{files}/vectors.npy"),
         "is not UTF-8 text"),
    Case("evaluate-anisotropy-one-sentence", EVALUATE,
         ("anisotropy", "--model", "{pre}", "--corpus", "{files}/one_line.txt"),
         "fewer than 2 sentences"),
    Case("evaluate-anisotropy-sentences-one", EVALUATE,
         ("anisotropy", "--model", "{pre}", "--corpus", "{files}/docs.txt", "--sentences", "1"),
         "--sentences must be at least 2"),
    Case("evaluate-anisotropy-plot-not-png", EVALUATE,
         ("anisotropy", "--model", "{pre}", "--corpus", "{files}/docs.txt", "--plot",
          "{tmp}/plot.jpg"), "give a .png file"),
    Case("evaluate-anisotropy-json-exists", EVALUATE,
         ("anisotropy", "--model", "{pre}", "--corpus", "{files}/docs.txt", "--json",
          "{tmp}/figures.json"), "already exists", setup=_write("figures.json", "{}\n")),
    Case("evaluate-anisotropy-json-is-the-corpus", EVALUATE,
         ("anisotropy", "--model", "{pre}", "--corpus", "{tmp}/corpus.json", "--json",
          "{tmp}/corpus.json", "--overwrite"), "would replace the",
         setup=_write("corpus.json", "a cat sat\na dog ran\n")),
    Case("evaluate-anisotropy-model-is-an-index", EVALUATE,
         ("anisotropy", "--model", "{index}", "--corpus", "{files}/docs.txt"), "is not a model"),

    # --- python -m bertjax.wsd ----------------------------------------------------------------
    Case("wsd-no-command", WSD, (), "required"),
    Case("wsd-fit-model-not-a-model", WSD, ("fit", "--model", "{files}", "--output", "{new}"),
         "is not a model"),
    Case("wsd-fit-model-is-a-sense-index", WSD,
         ("fit", "--model", "{senses}", "--output", "{new}"), "is not a model"),
    Case("wsd-fit-output-exists", WSD, ("fit", "--model", "{pre}", "--output", "{senses}"),
         "already exists"),
    Case("wsd-fit-overwrite-a-retrieval-index", WSD,
         ("fit", "--model", "{pre}", "--output", "{tmp}/wd", "--lemmas", "1", "--overwrite"),
         "--overwrite replaces only", setup=_copy("index")),
    Case("wsd-fit-zero-lemmas", WSD,
         ("fit", "--model", "{pre}", "--output", "{new}", "--lemmas", "0"),
         "--lemmas must be positive"),
    Case("wsd-fit-bad-layers", WSD,
         ("fit", "--model", "{pre}", "--output", "{new}", "--layers", "last"), "--layers takes"),
    Case("wsd-fit-batch-size-zero", WSD,
         ("fit", "--model", "{pre}", "--output", "{new}", "--batch-size", "0"),
         "--batch-size must be positive"),
    Case("wsd-fit-standardize-sentence-statistics", WSD,
         ("fit", "--model", "{pre}", "--output", "{new}", "--lemmas", "1", "--standardize",
          "{stats}/mean.npz"), "not words vectors"),
    Case("wsd-predict-index-missing", WSD, _predict_sense(index="{tmp}/nowhere"),
         "is not a sense index"),
    Case("wsd-predict-index-is-a-retrieval-index", WSD, _predict_sense(index="{index}"),
         "is not a sense index"),
    Case("wsd-predict-json-garbage", WSD, _predict_sense(index="{tmp}/wd"), "is damaged",
         setup=_copy("senses", _garbage("wsd_index.json"))),
    Case("wsd-predict-json-is-a-list", WSD, _predict_sense(index="{tmp}/wd"), "is damaged",
         setup=_copy("senses", _put_text("wsd_index.json", "[]\n"))),
    Case("wsd-predict-json-without-senses", WSD, _predict_sense(index="{tmp}/wd"), "is damaged",
         setup=_copy("senses", _edit_json("wsd_index.json", lambda i: i.pop("senses")))),
    Case("wsd-predict-truncated-npz", WSD, _predict_sense(index="{tmp}/wd"), "is damaged",
         setup=_copy("senses", _truncate("sense_vectors.npz"))),
    Case("wsd-predict-npz-missing", WSD, _predict_sense(index="{tmp}/wd"), "is damaged",
         setup=_copy("senses", _remove("sense_vectors.npz"))),
    Case("wsd-predict-word-not-in-sentence", WSD,
         ("predict", "--index", "{senses}", "--sentence", "A cat sat.", "--word", "zebra"),
         "does not occur in the sentence"),
    Case("wsd-predict-model-of-another-run", WSD, _predict_sense("--model", "{ft}"),
         "fitted with another model"),
    Case("wsd-predict-model-not-a-model", WSD, _predict_sense("--model", "{files}"),
         "is not a model"),
    Case("wsd-predict-standardize-not-fitted-with", WSD,
         _predict_sense("--standardize", "{stats}/mean.npz"), "fitted without standardisation"),
    Case("wsd-evaluate-holdout-one", WSD, ("evaluate", "--model", "{pre}", "--holdout", "1"),
         "holdout must be at least 2"),
    Case("wsd-evaluate-model-is-an-index", WSD, ("evaluate", "--model", "{index}"),
         "is not a model"),

    # --- python -m bertjax.main, fine-tuning methods ------------------------------------------
    Case("main-method-unknown", MAIN, _method("finetune.method=prefix_tuning"),
         "finetune.method"),
    Case("main-lora-rank-zero", MAIN, _method("finetune.method=lora", "finetune.lora_rank=0"),
         "finetune.lora_rank must be positive"),
    Case("main-lora-rank-over-hidden-size", MAIN,
         _method("finetune.method=lora", "finetune.lora_rank=4096"),
         "larger than the model's hidden size"),
    Case("main-lora-alpha-inf", MAIN,
         _method("finetune.method=lora", "finetune.lora_alpha=inf", NO_TRAIN_FILE),
         "must be a finite number"),
    Case("main-lora-dropout-nan", MAIN,
         _method("finetune.method=lora", "finetune.lora_dropout=nan", NO_TRAIN_FILE),
         "must be a finite number"),
    Case("main-lora-dropout-one", MAIN,
         _method("finetune.method=lora", "finetune.lora_dropout=1.0"),
         "finetune.lora_dropout must be in [0, 1)"),
    Case("main-lora-with-reinit-top-layers", MAIN,
         _method("finetune.method=lora", "finetune.reinit_top_layers=1"),
         "finetune.reinit_top_layers=1 with finetune.method=lora"),
    Case("main-adapter-size-zero", MAIN,
         _method("finetune.method=adapter", "finetune.adapter_size=0"),
         "finetune.adapter_size must be positive"),
    Case("main-adapter-with-freeze-encoder", MAIN,
         _method("finetune.method=adapter", "finetune.freeze_encoder=true"),
         "finetune.freeze_encoder belongs to finetune.method=full"),
    Case("main-soft-prompt-length-zero", MAIN,
         _method("finetune.method=soft_prompt", "finetune.prompt_length=0"),
         "finetune.prompt_length must be positive"),
    Case("main-cloze-without-verbalizer", MAIN, _method("finetune.method=cloze"),
         "needs finetune.verbalizer"),
    Case("main-cloze-template-without-mask", MAIN,
         _method("finetune.method=cloze", "finetune.verbalizer=0:bad,1:good",
                 "finetune.template={{text}} It was good."), "[MASK]"),

    # --- python -m bertjax.main, distillation (configs/distill.py) ----------------------------
    Case("main-distill-no-teacher", MAIN, _distill("distill.teacher="),
         "distillation needs the teacher"),
    Case("main-distill-temperature-inf", MAIN, _distill("distill.temperature=inf", NO_TRAIN_FILE),
         "must be a finite number"),
    Case("main-distill-temperature-nan", MAIN, _distill("distill.temperature=nan", NO_TRAIN_FILE),
         "must be a finite number"),
    Case("main-distill-temperature-zero", MAIN, _distill("distill.temperature=0"),
         "distill.temperature must be positive"),
    Case("main-distill-alpha-over-one", MAIN, _distill("distill.alpha=1.5"),
         "distill.alpha must be in [0, 1]"),
    Case("main-distill-student-layers-with-init-checkpoint", MAIN,
         _distill("init_checkpoint={pre}"), "leave config.init_checkpoint empty"),
    Case("main-distill-qa", MAIN, _distill("task=finetune_qa", "data.max_seq_len=128"),
         "distillation supports"),
    Case("main-distill-teacher-not-a-model", MAIN, _distill("distill.teacher={files}"),
         "is not a model"),
    Case("main-distill-teacher-is-a-pretraining-run", MAIN, _distill("distill.teacher={pre}"),
         "fine-tuned"),

    # --- python -m bertjax.main, non-finite settings ------------------------------------------
    Case("main-electra-discriminator-weight-inf", MAIN,
         _main("electra.py", "--workdir={new}", "--config.electra.discriminator_weight=inf",
               "--config.data.input={tmp}/corpus/*.txt"), "must be a finite number"),
    Case("main-electra-discriminator-weight-nan", MAIN,
         _main("electra.py", "--workdir={new}", "--config.electra.discriminator_weight=nan",
               "--config.data.input={tmp}/corpus/*.txt"), "must be a finite number"),
    Case("main-pretrain-learning-rate-nan", MAIN,
         _main("tiny.py", "--workdir={new}", "--config.optimizer.learning_rate=nan",
               "--config.data.prepared={tmp}/nowhere"),
         "must be a finite number"),
]
