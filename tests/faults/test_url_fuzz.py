"""Every argument of every command that takes a path which may be a URL, given hostile URLs with
the local GCS server running: each must exit 2 with one stderr line, `bertjax: error:`, naming
the value given, within the storage timeout plus a margin, and create nothing (no local output or
workdir, no object in the test bucket, no object of it changed).

ARGUMENTS is the table: one row per argument, its command line with `{url}` where the hostile
value goes and the other arguments valid (`{model}` a params export converted from a small
Hugging Face BERT, `{files}` the catalog's small data files, `{index}` an index and `{stats}`
statistics made with the model, `{corpus}` a prepared corpus, `{cfg}` the configs directory,
`{new}` a path in the case's own directory that must not be created). The commands run in this
process (cli_in_process)."""

import os
import time

import pytest

import cli_in_process
from bertjax.core import storage, transfer
from faults.catalog_cases import write_files
from faults.test_catalog import changes, tree
from faults.tiny_hf import tiny_hf_dir
from pretrain_runs import REPO, tiny_args

pytestmark = pytest.mark.gcs

TIMEOUT_S = 3  # BERTJAX_STORAGE_TIMEOUT while the cases run
BOUND_S = TIMEOUT_S + 30  # the timeout, and a command's start: its imports, a model loaded

# {b}: the test bucket.
BUCKET_ROOT = "gs://{b}/"
HOSTILE = ("gs://", "gs:///x", "gs://no-such-bucket-xyz/x", "gs://BAD_Bucket/x", BUCKET_ROOT,
           "gs://{b}/x/../y", "gs://{b}/x?y#z", "gs://{b}/x?generation=1", "gs://{b}/x y",
           "gs://{b}/x\ny", "s3://{b}/x", "http://127.0.0.1:9/x", "file:///nonexistent",
           "nosuch://{b}/x", "gs://{b}/" + "x" * 1100)


def _pretrain(**settings) -> tuple:
    return tuple(tiny_args("{new}", "{corpus}", **{"train.steps": 1, "optimizer.warmup_steps": 0,
                                                 **settings})[1:])


def _finetune(**settings) -> tuple:
    values = {"data.train": "{files}/train.tsv", "data.eval": "{files}/dev.tsv",
              "init_checkpoint": "{model}", "train.steps": 1, "train.batch_size": 8, **settings}
    return ("--config={cfg}/finetune_sentiment.py", "--workdir={new}",
            *(f"--config.{k}={v}" for k, v in values.items()))


EMBED = ("--model", "{model}", "--input", "{files}/docs.txt", "--pooling", "mean", "--output",
         "{new}.npy")
FIT = ("--model", "{model}", "--fit-standardizer", "{files}/docs.txt", "--pooling", "mean",
       "--output", "{new}.npz")
BUILD = ("build", "--model", "{model}", "--corpus", "{files}/docs.jsonl", "--output", "{new}")
SEARCH = ("search", "--index", "{index}", "--queries", "{files}/queries.txt", "--output",
          "{new}.jsonl")
EVALUATE = ("evaluate", "--index", "{index}", "--queries", "{files}/queries.jsonl")
EXPORT = ("--workdir", "{model}", "--format", "params", "--output", "{new}")
PREPARE = ("--input", "{files}/docs.txt", "--output", "{new}", "--vocab",
           "{model}/tokenizer", "--workers", "1", "--no-progress")
INSPECT = ("--config={cfg}/tiny.py", "--workdir={new}", "--config.data.prepared={corpus}",
           "--config.data.workers=0")
# The corpus in WORKDIR/data, prepared there from this text when missing.
INSPECT_WORKDIR = ("--config={cfg}/tiny.py", "--workdir={url}", "--config.data.workers=0",
                   "--config.data.input={files}/docs.txt",
                   "--config.data.tokenizer={model}/tokenizer")
ANISOTROPY = ("anisotropy", "--model", "{model}", "--corpus", "{files}/docs.txt",
              "--sentences", "4")


def _with(args: tuple, flag: str, value: str = "{url}") -> tuple:
    """`args` with `flag`'s value (the next argument, or `--flag=value`) set to `value`."""
    out = list(args)
    for i, arg in enumerate(out):
        if arg == flag:
            out[i + 1] = value
            return tuple(out)
        if arg.startswith(flag + "="):
            out[i] = f"{flag}={value}"
            return tuple(out)
    return (*out, flag, value) if flag.startswith("--") and "." not in flag else \
        (*out, f"{flag}={value}")


# (id, module, arguments)
ARGUMENTS = [
    ("main-workdir", "main", _with(_pretrain(), "--workdir")),
    ("main-data.prepared", "main", _pretrain(**{"data.prepared": "{url}"})),
    ("main-data.input", "main", _pretrain(**{"data.input": "{url}",
                                             "data.prepared": "{new}-prepared"})),
    ("main-data.tokenizer", "main", _pretrain(**{"data.input": "{files}/docs.txt",
                                                 "data.prepared": "{new}-prepared",
                                                 "data.tokenizer": "{url}"})),
    ("main-init_checkpoint", "main", _pretrain(init_checkpoint="{url}")),
    ("finetune-init_checkpoint", "main", _finetune(init_checkpoint="{url}")),
    ("finetune-data.train", "main", _finetune(**{"data.train": "{url}"})),
    ("finetune-data.eval", "main", _finetune(**{"data.eval": "{url}"})),
    ("finetune-data.tokenizer", "main", _finetune(**{"data.tokenizer": "{url}"})),
    ("compile-json", "bertjax.cli.compile",
     ("--topology=v5e-8", "--config={cfg}/tiny.py", "--json={url}")),
    ("convert-from-hf", "convert", ("--from-hf", "{url}", "--output", "{new}")),
    ("convert-output", "convert", ("--from-hf", "{hf}", "--output", "{url}")),
    ("export-workdir", "export", _with(EXPORT, "--workdir")),
    ("export-output", "export", _with(EXPORT, "--output")),
    ("export-tokenizer", "export", _with(EXPORT, "--tokenizer")),
    ("embed-model", "embed", _with(EMBED, "--model")),
    ("embed-input", "embed", _with(EMBED, "--input")),
    ("embed-output", "embed", _with(EMBED, "--output")),
    ("embed-standardize", "embed", _with(EMBED, "--standardize")),
    ("embed-fit-standardizer", "embed", _with(FIT, "--fit-standardizer")),
    ("embed-fit-output", "embed", _with(FIT, "--output")),
    ("index-build-model", "index", _with(BUILD, "--model")),
    ("index-build-corpus", "index", _with(BUILD, "--corpus")),
    ("index-build-output", "index", _with(BUILD, "--output")),
    ("index-build-standardize", "index", _with(BUILD, "--standardize")),
    ("index-search-index", "index", _with(SEARCH, "--index")),
    ("index-search-queries", "index", _with(SEARCH, "--queries")),
    ("index-search-model", "index", _with(SEARCH, "--model")),
    ("index-search-rerank", "index", _with(SEARCH, "--rerank")),
    ("index-search-standardize", "index", _with(SEARCH, "--standardize")),
    ("index-search-output", "index", _with(SEARCH, "--output")),
    ("index-evaluate-index", "index", _with(EVALUATE, "--index")),
    ("index-evaluate-queries", "index", _with(EVALUATE, "--queries")),
    ("prepare-input", "data.prepare", _with(PREPARE, "--input")),
    ("prepare-output", "data.prepare", _with(PREPARE, "--output")),
    ("prepare-vocab", "data.prepare", _with(PREPARE, "--vocab")),
    ("inspect-workdir", "data.inspect", INSPECT_WORKDIR),
    ("inspect-data.prepared", "data.inspect", _with(INSPECT, "--config.data.prepared")),
    ("inspect-dump", "data.inspect", (*INSPECT, "--dump={url}")),
    ("evaluate-anisotropy-model", "evaluate", _with(ANISOTROPY, "--model")),
    ("evaluate-anisotropy-corpus", "evaluate", _with(ANISOTROPY, "--corpus")),
    ("evaluate-anisotropy-json", "evaluate", (*ANISOTROPY, "--json", "{url}")),
    ("evaluate-anisotropy-plot", "evaluate", (*ANISOTROPY, "--plot", "{url}")),
    ("evaluate-similarity-model", "evaluate", ("similarity", "--model", "{url}")),
    ("evaluate-similarity-standardize", "evaluate",
     ("similarity", "--model", "{model}", "--standardize", "{url}")),
    ("wsd-fit-model", "bertjax.cli.wsd", ("fit", "--model", "{url}", "--output", "{new}")),
    ("wsd-fit-output", "bertjax.cli.wsd", ("fit", "--model", "{model}", "--output", "{url}")),
    ("wsd-predict-index", "bertjax.cli.wsd",
     ("predict", "--index", "{url}", "--sentence", "the bank of the river", "--word", "bank")),
    ("bench-json", "bench", ("--config={cfg}/tiny.py", "--steps=1", "--warmup=0",
                             "--json={url}")),
    ("wiki-pairs-output", "bertjax.finetune.packaged.wiki_pairs", ("--output", "{url}")),
]
assert len({row[0] for row in ARGUMENTS}) == len(ARGUMENTS)
# The arguments a command writes to: a bucket's root is no place for them. (Read from, a bucket's
# root is a directory like another: `prepare --input gs://b/` reads every object in it.)
WRITTEN = {"main-workdir", "main-data.prepared", "compile-json", "convert-output",
           "export-output", "embed-output", "embed-fit-output", "index-build-output",
           "index-search-output", "prepare-output", "inspect-workdir", "inspect-data.prepared",
           "inspect-dump", "evaluate-anisotropy-json", "evaluate-anisotropy-plot",
           "wsd-fit-output", "bench-json", "wiki-pairs-output"}
assert WRITTEN <= {row[0] for row in ARGUMENTS}


@pytest.fixture(scope="module")
def inputs(tmp_path_factory, bert_vocab_path, small_corpus_dir) -> dict:
    """Valid values for the arguments a row does not make hostile."""
    root = tmp_path_factory.mktemp("url_fuzz_inputs")
    files = str(root / "files")
    write_files(files)
    paths = {"cfg": os.path.join(REPO, "configs"), "files": files, "corpus": small_corpus_dir,
             "hf": tiny_hf_dir(root / "hf", bert_vocab_path), "model": str(root / "model"),
             "index": str(root / "index"), "stats": str(root / "stats.npz")}
    for command in [("convert", "--from-hf", paths["hf"], "--output", paths["model"]),
                    ("index", "build", "--model", paths["model"], "--corpus",
                     f"{files}/docs.jsonl", "--output", paths["index"]),
                    ("embed", "--model", paths["model"], "--fit-standardizer",
                     f"{files}/docs.txt", "--pooling", "mean", "--output", paths["stats"])]:
        done = cli_in_process.run(*command)
        assert done.returncode == 0, (command, done.stderr[-3000:])
    return paths


def _bucket_state(bucket: str) -> dict:
    return {name: entry.get("md5") for name, entry in transfer.remote_files(bucket).items()}


@pytest.mark.parametrize("row", ARGUMENTS, ids=[row[0] for row in ARGUMENTS])
def test_a_hostile_url_is_refused_in_one_line_naming_it(row, inputs, gcs_bucket, tmp_path,
                                                        monkeypatch):
    name, module, template = row
    bucket = f"gs://{gcs_bucket}"
    storage.write_bytes(f"{bucket}/kept/notes.txt", b"someone else's")
    monkeypatch.setenv("BERTJAX_STORAGE_TIMEOUT", str(TIMEOUT_S))
    failures = []
    for hostile in HOSTILE:
        if hostile == BUCKET_ROOT and name not in WRITTEN:
            continue
        url = hostile.format(b=gcs_bucket)
        case = str(tmp_path / f"case{HOSTILE.index(hostile)}")
        os.makedirs(case)
        args = [arg.format(url=url, new=os.path.join(case, "new"), **inputs) for arg in template]
        local, remote, repo = tree(case), _bucket_state(bucket), set(os.listdir(REPO))
        started = time.monotonic()
        done = cli_in_process.run(module, *args)
        seconds = time.monotonic() - started
        lines = done.stderr.splitlines()
        problems = [
            f"exit {done.returncode}" if done.returncode != 2 else "",
            f"{len(lines)} stderr lines" if len(lines) != 1 else "",
            "no `bertjax: error:`" if not done.stderr.startswith("bertjax: error:") else "",
            "the value is not named" if " ".join(url.split()) not in done.stderr and
            repr(url)[1:-1] not in done.stderr else "",
            f"{seconds:.0f} s" if seconds > BOUND_S else "",
            *changes(local, tree(case))[:3],
            *(f"object {c[:80]}" for c in changes(remote, _bucket_state(bucket))[:3]),
            *(f"{REPO}/{n} created" for n in set(os.listdir(REPO)) - repo)]
        problems = [p for p in problems if p]
        if problems:
            failures.append(f"{url[:60]!r}: {', '.join(problems)}\n    "
                            f"{done.stderr.strip()[-400:]}")
    assert not failures, f"{name}:\n" + "\n".join(failures)


def test_an_input_on_a_bucket_that_is_not_what_was_asked_is_named_by_its_url(inputs, gcs_bucket,
                                                                              tmp_path):
    """Inputs named by URL are read through local copies: the refusal names the URL given."""
    url = f"gs://{gcs_bucket}/notes"
    storage.write_bytes(f"{url}/notes.txt", b"not a vocabulary")
    done = cli_in_process.run("export", "--workdir", inputs["model"], "--format", "params",
                              "--output", str(tmp_path / "out"), "--tokenizer", url)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"bertjax: error: {url} holds no tokenizer"), done.stderr
    assert not os.path.exists(tmp_path / "out")
