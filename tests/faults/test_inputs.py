"""Bad input a new user gives the CLIs, injected for real: each is refused in one line on stderr
with exit status 2 and no traceback, and what was already on disk stays byte for byte.

Covers: inspect --dump over an existing file, a label listed twice, a CSV with an unterminated
quote, a corpus of one overlong line, a prepared vocabulary that disagrees with --vocab-size,
SQuAD files of the wrong shape, a vocabulary shorter than the embeddings at convert time,
export's log noise and private permissions, and a full disk during preparation (a real tmpfs).
"""

import dataclasses
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest

import cli_in_process
from bertjax.data import corpus

from bertjax.data import batch_report
from bertjax.data.tokenizer import SPECIAL_TOKENS, WordPieceTokenizer
from bertjax.core.errors import UserError
from bertjax.finetune import readers
from bertjax.finetune.readers import Source
from bertjax.finetune.tasks import base as task_base
from bertjax.settings import finetune as finetune_settings
from faults.file_trees import md5s

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
PYTHON = sys.executable
UMASK = 0o027  # not the usual 022, so that "follows the umask" cannot pass by accident
WORDS = "the a cat dog sat on mat river bank money flows north south city old new house".split()


def cli(module: str, *args: str) -> subprocess.CompletedProcess:
    """`python -m bertjax.MODULE ARGS` run in this process (cli_in_process: the refusals are our
    code's), under UMASK. The full disk below is a real process: it needs its own mount."""
    old = os.umask(UMASK)
    try:
        return cli_in_process.run(module, *args)
    finally:
        os.umask(old)


def assert_refused(run: subprocess.CompletedProcess, *phrases: str) -> None:
    assert run.returncode == 2, (run.returncode, run.stderr)
    assert "Traceback" not in run.stderr, run.stderr
    lines = run.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith("bertjax: error: "), run.stderr
    for phrase in phrases:
        assert phrase in lines[0], lines[0]


def modes(root: str) -> set[tuple[str, int]]:
    """('dir' | 'file', permission bits) of root and everything below it."""
    found = {("dir", stat.S_IMODE(os.stat(root).st_mode))}
    for directory, dirs, files in os.walk(root):
        found |= {("dir", stat.S_IMODE(os.stat(os.path.join(directory, d)).st_mode)) for d in dirs}
        found |= {("file", stat.S_IMODE(os.stat(os.path.join(directory, f)).st_mode))
                  for f in files}
    return found


def write_documents(path, documents: int, sentences: int = 20, seed: int = 0) -> str:
    rng = np.random.default_rng(seed)
    text = "\n\n".join("\n".join(" ".join(rng.choice(WORDS, 12)) + " ." for _ in range(sentences))
                       for _ in range(documents))
    path.write_text(text + "\n", encoding="utf-8")
    return str(path)


# --- 4: inspect --dump --------------------------------------------------------------------------

def test_inspect_dump_refuses_an_existing_file_before_any_work_and_follows_the_umask(tmp_path):
    existing = tmp_path / "batches.npz"
    existing.write_bytes(b"results of an earlier inspection")
    before = md5s(str(existing))
    # An empty workdir: reaching the data (preparing a corpus) would fail differently.
    run = cli("data.inspect", "--config=configs/base.py", f"--workdir={tmp_path / 'run'}",
              f"--dump={existing}")
    assert_refused(run, str(existing), "already exists", "--overwrite")
    assert md5s(str(existing)) == before and not (tmp_path / "run").exists()

    batch = {"input_ids": np.arange(8, dtype=np.int32).reshape(2, 4)}
    old = os.umask(UMASK)
    try:
        with pytest.raises(UserError, match="already exists"):
            batch_report.write_dump(str(existing), [batch])
        # --overwrite replaces an earlier dump, never a file of something else.
        with pytest.raises(UserError, match="is not a batch dump .* --overwrite replaces only"):
            batch_report.write_dump(str(existing), [batch], overwrite=True)
        assert md5s(str(existing)) == before
        existing.unlink()
        batch_report.write_dump(str(existing), [{"input_ids": batch["input_ids"] + 1}])
        batch_report.write_dump(str(existing), [batch], overwrite=True)
        batch_report.write_dump(str(tmp_path / "new.npz"), [batch])
    finally:
        os.umask(old)
    for path in (existing, tmp_path / "new.npz"):
        assert stat.S_IMODE(os.stat(path).st_mode) == 0o666 & ~UMASK
        np.testing.assert_array_equal(np.load(path)["input_ids"], batch["input_ids"])


# --- 11: a label listed twice -------------------------------------------------------------------

def test_a_label_listed_twice_is_refused_by_name():
    from configs import finetune_sentiment

    config = finetune_sentiment.get_config()
    config.data.labels = "0,1,1"
    with pytest.raises(UserError, match="data.labels lists 1 twice"):
        finetune_settings.read(config, require_data=False)
    with pytest.raises(UserError, match="lists neg 3 times"):
        task_base.TaskSettings(labels=("neg", "pos", "neg", "neg"))
    with pytest.raises(UserError, match="data.labels lists b twice"):
        task_base.parse_labels("a, b,b")
    assert task_base.parse_labels(" neg , pos,") == ("neg", "pos")


# --- 12: a CSV with an unterminated quote -------------------------------------------------------

def test_an_unterminated_quote_in_a_csv_is_refused_not_merged(tmp_path):
    broken = tmp_path / "train.csv"
    # Row 3 opens a quote that the text of row 5 happens to close: csv reads rows 3-5 as one
    # example of the right width, labelled 1, and row 4's example disappears.
    broken.write_text('sentence,label\ngood film,1\n"bad film,0\nfine film,1\nnice", 1\nok,0\n',
                      encoding="utf-8")
    with pytest.raises(UserError, match=r"train.csv:3: a quoted field runs on to line 5 "
                                        r"\(an unterminated quote\?\)"):
        readers.read(Source(str(broken)), "text")
    fine = tmp_path / "fine.csv"
    fine.write_text('sentence,label\n"good, even great",1\n"a ""quoted"" word",0\n',
                    encoding="utf-8")
    examples = readers.read(Source(str(fine)), "text")
    assert [(e.text, e.label) for e in examples] == [("good, even great", "1"),
                                                     ('a "quoted" word', "0")]


# --- 13: a corpus of one overlong line ----------------------------------------------------------

def test_a_corpus_of_one_overlong_line_names_the_skipped_lines_and_the_limit(tmp_path):
    text = tmp_path / "one_line.txt"
    text.write_text("word " * 250_000 + "\n", encoding="utf-8")  # 1.25 M characters, one line
    run = cli("data.prepare", "--input", str(text), "--output", str(tmp_path / "out"),
              "--vocab-size", "100", "--workers", "1", "--no-progress")
    assert_refused(run, "the corpus is empty", "1 line was skipped as longer than the limit of "
                   "1,000,000 characters", "--max-line-chars")
    assert not (tmp_path / "out").exists()


# --- 14: a prepared vocabulary that disagrees ---------------------------------------------------

@pytest.fixture(scope="module")
def prepared_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("prepared")
    text = write_documents(root / "docs.txt", documents=6)
    output = str(root / "out")
    run = cli("data.prepare", "--input", text, "--output", output, "--vocab-size", "60",
              "--workers", "1", "--no-progress")
    assert run.returncode == 0, run.stderr
    return text, output


def test_a_prepared_vocabulary_does_not_silently_win_over_an_explicit_size(prepared_dir):
    text, output = prepared_dir
    before = md5s(output)
    run = cli("data.prepare", "--input", text, "--output", output, "--vocab-size", "80",
              "--workers", "1", "--no-progress")
    assert_refused(run, output, "trained for 60 tokens, not the 80 asked for")
    other = WordPieceTokenizer(list(SPECIAL_TOKENS) + WORDS)
    other_dir = os.path.join(os.path.dirname(output), "other_vocab")
    other.save(other_dir)
    run = cli("data.prepare", "--input", text, "--output", output, "--vocab", other_dir,
              "--workers", "1", "--no-progress")
    assert_refused(run, "prepared with another vocabulary", other_dir)
    assert md5s(output) == before

    # The function the pretraining job shares: a default only warns, the same vocabulary passes.
    [warning] = corpus.check_prepared_matches(output, vocab_size=30522, explicit=False)
    assert "trained for 60 tokens, not the 30522" in warning
    assert corpus.check_prepared_matches(output, vocab_size=60, explicit=True) == []
    saved = os.path.join(output, corpus.TOKENIZER_DIR)
    assert corpus.check_prepared_matches(output, tokenizer_spec=saved, vocab_size=5) == []
    assert md5s(output) == before


# --- 15: SQuAD shapes, and a vocabulary shorter than the embeddings -----------------------------

def test_squad_files_of_the_wrong_shape_are_named_with_the_place(tmp_path):
    qa = {"id": "q1", "question": "When?"}
    paragraph = {"context": "It was founded in 1851.", "qas": [qa]}
    cases = [
        ([{"data": []}], "the top level is a JSON list, expected an object with \"data\""),
        ({"data": [{"paragraphs": [paragraph]}]},
         "data[0].paragraphs[0].qas[0] (id q1) has no \"answers\""),
        ({"data": [{"paragraphs": [{**paragraph, "qas": [{**qa, "answers": [{"text": "1851"}]}]}]}]},
         "data[0].paragraphs[0].qas[0] (id q1) answers[0] has no \"answer_start\""),
    ]
    for n, (document, message) in enumerate(cases):
        path = tmp_path / f"squad{n}.json"
        path.write_text(json.dumps(document), encoding="utf-8")
        with pytest.raises(UserError) as error:
            readers.read(Source(str(path)), "qa")
        assert str(error.value).startswith(str(path)) and message in str(error.value)
        assert "\n" not in str(error.value)
    # Prediction inputs need no answers.
    path = tmp_path / "predict.json"
    path.write_text(json.dumps({"data": [{"paragraphs": [paragraph]}]}), encoding="utf-8")
    [example] = readers.read(Source(str(path), labeled=False), "qa")
    assert example.answers == [] and example.id == "q1"


def test_convert_refuses_a_vocabulary_shorter_than_the_embeddings(tmp_path, minilm_dir):
    hf = tmp_path / "hf"
    hf.mkdir()
    for name in ("config.json", "tokenizer_config.json"):
        shutil.copy(os.path.join(minilm_dir, name), hf / name)
    os.symlink(os.path.join(minilm_dir, "model.safetensors"), hf / "model.safetensors")
    with open(os.path.join(minilm_dir, "vocab.txt"), encoding="utf-8") as f:
        vocab = f.read().splitlines()
    (hf / "vocab.txt").write_text("\n".join(vocab[:-22]) + "\n", encoding="utf-8")
    before = md5s(str(hf))
    run = cli("convert", "--from-hf", str(hf), "--output", str(tmp_path / "out"))
    assert_refused(run, "vocab.txt has 30500 tokens, fewer than the model's 30522 word "
                   "embeddings")
    assert not (tmp_path / "out").exists() and md5s(str(hf)) == before


# --- 16: export's stderr and permissions --------------------------------------------------------

def tiny_pretraining_workdir(root) -> str:
    """A workdir as a pretraining run leaves it: an Orbax train state and run.json."""
    from bertjax.model.config import EncoderConfig
    from bertjax.model.heads import BertForPretraining
    from bertjax.train.checkpoint import Checkpointer
    from bertjax.train.state import TrainState
    from bertjax.jobs.run_directory import RunDirectory

    tokenizer_dir = str(root / "tokenizer")
    WordPieceTokenizer(list(SPECIAL_TOKENS) + WORDS).save(tokenizer_dir)
    encoder = EncoderConfig(vocab_size=len(SPECIAL_TOKENS) + len(WORDS), hidden_size=16,
                            num_layers=1, num_heads=2, intermediate_size=32,
                            max_position_embeddings=32)
    model = BertForPretraining(encoder, nsp=True, sbo=False, max_span_length=4)
    batch = {k: jnp.zeros((1, 4), jnp.int32) for k in (
        "input_ids", "segment_ids", "input_mask", "masked_positions", "span_left", "span_right",
        "span_offset")}
    # From shapes alone: an eager init would compile every parameter's initializer.
    shapes = nn.meta.unbox(jax.eval_shape(model.init, jax.random.key(0), batch)["params"])
    rng = np.random.default_rng(0)
    params = jax.tree.map(lambda s: jnp.asarray(0.1 * rng.standard_normal(s.shape), s.dtype),
                          shapes)
    state = TrainState(step=jnp.int32(3), params=params,
                       opt_state=jax.jit(optax.adamw(1e-3).init)(params),
                       rng=jax.random.PRNGKey(0))
    workdir = str(root / "run")
    with Checkpointer(workdir) as checkpointer:
        checkpointer.save(3, state, {"position": 3})
    RunDirectory(workdir).write_record({"task": "pretrain"}, info={
        "task": "pretrain", "encoder": dataclasses.asdict(encoder),
        "heads": {"nsp": True, "sbo": False, "max_span_length": 4},
        "tokenizer_dir": tokenizer_dir})
    return workdir


def test_export_prints_no_routine_warnings_and_follows_the_umask(tmp_path):
    workdir = tiny_pretraining_workdir(tmp_path)
    before = md5s(workdir)
    for fmt in ("params", "hf"):
        output = str(tmp_path / f"export_{fmt}")
        run = cli("export", "--workdir", workdir, "--format", fmt, "--output", output)
        assert run.returncode == 0, run.stderr
        assert run.stderr == "" and "wrote the" in run.stdout, run.stderr
        assert modes(output) <= {("dir", 0o777 & ~UMASK), ("file", 0o666 & ~UMASK)}, modes(output)
    assert md5s(workdir) == before


# --- 8: a full disk during preparation ----------------------------------------------------------

def _mount_runner(probe_dir: str) -> list[str]:
    """A command prefix under which this process may mount a tmpfs: a private mount namespace
    as root, else a user namespace mapping us to root. Never skipped: no way is a failure."""
    probe = f"mount -t tmpfs -o size=16k tmpfs {shlex.quote(probe_dir)} && umount " \
            f"{shlex.quote(probe_dir)}"
    for prefix in (["unshare", "--mount"], ["unshare", "--user", "--map-root-user", "--mount"],
                   []):
        if shutil.which("unshare") is None and prefix:
            continue
        if subprocess.run(prefix + ["sh", "-c", probe], capture_output=True).returncode == 0:
            return prefix
    pytest.fail("cannot mount a tmpfs here (neither as root nor in a user namespace)")


@pytest.mark.slow
def test_a_full_disk_is_one_line_and_the_written_shards_survive_to_resume(tmp_path):
    disk = tmp_path / "disk"
    disk.mkdir()
    logs = tmp_path / "logs"
    logs.mkdir()
    text = write_documents(tmp_path / "docs.txt", documents=30)
    output = disk / "prepared"
    prepare_cmd = " ".join(shlex.quote(a) for a in (
        PYTHON, "-m", "bertjax.data.prepare", "--input", text, "--output", str(output),
        "--vocab-size", "100", "--workers", "1", "--no-progress", "--documents-per-shard", "1"))
    shards = shlex.quote(str(output / corpus.SHARDS_DIR))
    d, log = shlex.quote(str(disk)), shlex.quote(str(logs))
    # About 3 of the 30 one-document shards fit in 64 KiB (tmpfs counts 4 KiB pages a file).
    script = f"""
        umask {UMASK:o}; export PYTHONPATH={shlex.quote(REPO)} TOKENIZERS_PARALLELISM=false
        mount -t tmpfs -o size=64k tmpfs {d} || exit 99
        {prepare_cmd} >{log}/out1 2>{log}/err1; echo $? >{log}/rc1
        (cd {shards} && find . -name '*.npy' | sort | xargs -r md5sum) >{log}/md5_1
        ls -a {shards} >{log}/ls1
        mount -o remount,size=4m {d}
        {prepare_cmd} >{log}/out2 2>{log}/err2; echo $? >{log}/rc2
        (cd {shards} && find . -name '*.npy' | sort | xargs -r md5sum) >{log}/md5_2
        umount {d}
    """
    ran = subprocess.run(_mount_runner(str(disk)) + ["sh", "-c", script], capture_output=True,
                         text=True, cwd=REPO, timeout=300)
    assert ran.returncode == 0, ran.stderr
    first = subprocess.CompletedProcess([], int((logs / "rc1").read_text()), "",
                                        (logs / "err1").read_text())
    assert_refused(first, "no space left on the device", str(output), "free there",
                   "complete shards are kept")
    written = (logs / "md5_1").read_text().splitlines()
    assert len(written) >= 4 * 2, written  # at least two whole shards (4 arrays each) fit
    assert not [n for n in (logs / "ls1").read_text().split() if ".tmp-" in n]
    assert (logs / "rc2").read_text().strip() == "0", (logs / "err2").read_text()
    assert "prepared" in (logs / "out2").read_text() and "30 documents" in (
        logs / "out2").read_text()
    # The resumed run kept the shards written before the disk filled, byte for byte.
    assert set(written) <= set((logs / "md5_2").read_text().splitlines())
    assert len((logs / "md5_2").read_text().splitlines()) == 30 * 4
