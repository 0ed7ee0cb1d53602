"""The catalog of bad input: realistic mistakes for every command-line entry point, each one a
`Case` that test_catalog.py runs (in-process, or as a real process where that matters) and
expects refused in one line.

Arguments are templates. `{pre}`, `{ft}`, `{params}`, `{hf}`, `{corpus}` and `{files}` name the
shared inputs (a finished pretraining workdir, a finished fine-tuning workdir made from it, its
params and Hugging Face exports, a prepared corpus, small data files); `{cfg}` the configs
directory; `{tmp}` the case's own directory (made before the case, with what its `setup` puts
there) and `{new}` a path inside it that a refused command must not create. Every directory a
case names must be left as it was, byte for byte and entry for entry.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import string
from typing import Callable

# The shared inputs a case may name: each is watched whenever a case names it.
SHARED = ("pre", "ft", "params", "hf", "corpus", "files")
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


def _roberta(config: dict) -> None:
    config.update(architectures=["RobertaForMaskedLM"], model_type="roberta")


def _truncate(name: str) -> Callable[[str], None]:
    def damage(directory: str) -> None:
        path = os.path.join(directory, name)
        with open(path, "r+b") as f:
            f.truncate(os.path.getsize(path) // 2)
    return damage


# --- the shared data files ----------------------------------------------------------------------

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
    Case("main-pretrain-does-not-fit-device-memory", MAIN,
         _pretrain("train.device_memory_gb=0.001"), "per device but a device holds"),
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
         _prepare("--input", "{files}/docs.txt", "--train-vocab", "bpe"), "invalid choice"),
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
         "RobertaForMaskedLM", setup=_copy("hf", _edit_json("config.json", _roberta))),
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
]
