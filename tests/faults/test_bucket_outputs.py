"""Outputs on a bucket (bertjax.core.remote_output, remote_publish) under SIGTERM: during the work,
and during the upload after k objects, for convert, export and embed to gs://. Each case: exit
143 and one line saying what was removed or left, the listing it describes, every pre-existing
object's md5 unchanged where nothing older may change, and a rerun that succeeds.

The command runs in a child process that signals itself at an exact point (as
tests/pretrain_runs.py CHILD does): SIGTERM_IN="module:attribute" sends SIGTERM as that function
is called; SIGTERM_AFTER_PUTS=k sends it once the k-th object of the output is uploaded, and
STOP_PID=P first SIGSTOPs process P (the storage server: the removal cannot be done);
SIGTERM_AFTER_TREE_OBJECTS=k once transfer.upload_tree (a prepared corpus) uploaded k objects."""

import subprocess
import sys
import textwrap
import time

import pytest

from bertjax.core import remote_publish, storage, transfer
from bertjax.inference import loading
from cli_in_process import run as run_in_process
from faults.tiny_hf import tiny_hf_dir
from pretrain_runs import REPO, child_env

pytestmark = pytest.mark.gcs

TIMEOUT_S = 5  # BERTJAX_STORAGE_TIMEOUT of the children
BOUND_S = 120  # a child's start (JAX, torch) and its work, plus the timeout

CHILD = textwrap.dedent("""
    import functools, importlib, os, signal, sys
    where = os.environ.get("SIGTERM_IN")
    if where:
        module, _, attribute = where.partition(":")
        owner = importlib.import_module(module)
        *path, name = attribute.split(".")
        for part in path:
            owner = getattr(owner, part)
        original = getattr(owner, name)
        @functools.wraps(original)
        def signalled(*args, **kwargs):
            os.kill(os.getpid(), signal.SIGTERM)
            return original(*args, **kwargs)
        setattr(owner, name, signalled)
    after = int(os.environ.get("SIGTERM_AFTER_PUTS", "0"))
    if after:
        from bertjax.core import remote_publish
        put, done = remote_publish.put_object, []
        def put_then_signal(*args, **kwargs):
            put(*args, **kwargs)
            done.append(1)
            if len(done) == after:
                if os.environ.get("STOP_PID"):
                    os.kill(int(os.environ["STOP_PID"]), signal.SIGSTOP)
                os.kill(os.getpid(), signal.SIGTERM)
        remote_publish.put_object = put_then_signal
    tree_objects = os.environ.get("SIGTERM_AFTER_TREE_OBJECTS")
    if tree_objects:  # transfer.upload_tree (a prepared corpus): once that many are uploaded
        from bertjax.core import transfer
        upload = transfer.upload_tree
        def upload_signalling(*args, before_each=lambda uploaded: None, **kwargs):
            def signalled(uploaded):
                if len(uploaded) == int(tree_objects):
                    os.kill(os.getpid(), signal.SIGTERM)
                before_each(uploaded)
            return upload(*args, before_each=signalled, **kwargs)
        transfer.upload_tree = upload_signalling
    command = importlib.import_module(sys.argv[1])
    sys.exit(command.main(sys.argv[2:]))
""")


def _child(module: str, *args: str, **env) -> subprocess.CompletedProcess:
    started = time.monotonic()
    done = subprocess.run([sys.executable, "-c", CHILD, module, *args], cwd=REPO,
                          capture_output=True, text=True, timeout=2 * BOUND_S,
                          env=child_env(BERTJAX_STORAGE_TIMEOUT=TIMEOUT_S, **env))
    assert time.monotonic() - started < BOUND_S, done.stderr[-2000:]
    return done


def _terminated(done, *phrases) -> str:
    lines = [line for line in done.stderr.splitlines()
             if "google_auth_provider" not in line]  # tensorstore's, once per process
    assert done.returncode == 143, done.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("bertjax: stopped by SIGTERM"), lines
    for phrase in phrases:
        assert phrase in lines[0], lines[0]
    return lines[0]


def _objects(url: str) -> dict[str, str]:
    """Every object at or under `url` with its md5 (GCS's digest)."""
    return {name: entry.get("md5", "") for name, entry in transfer.remote_files(url).items()}


@pytest.fixture(scope="module")
def hf_dir(tmp_path_factory, bert_vocab_path) -> str:
    return tiny_hf_dir(tmp_path_factory.mktemp("hf") / "hf", bert_vocab_path)


@pytest.fixture
def bucket(gcs_bucket) -> str:
    """A bucket holding one object of someone else's, which no case may touch."""
    storage.write_bytes(f"gs://{gcs_bucket}/kept/notes.txt", b"not bertjax's")
    return f"gs://{gcs_bucket}"


def _convert(hf_dir, output, *extra, **env):
    return _child("bertjax.cli.convert", "--from-hf", hf_dir, "--output", output, *extra, **env)


def test_convert_stopped_while_converting_or_uploading_leaves_nothing_and_reruns(hf_dir, bucket):
    before = _objects(bucket)
    output = f"{bucket}/converted"
    cases = {  # where SIGTERM arrives: what the line says
        "work": ({"SIGTERM_IN": "bertjax.interop.params_dir:ocp.PyTreeCheckpointer.save"},
                 "nothing was uploaded or changed"),
        "marker": ({"SIGTERM_IN": "bertjax.core.remote_publish:Upload._mark"},
                   "nothing had been uploaded, and nothing older was changed"),
        "after 1": ({"SIGTERM_AFTER_PUTS": 1},
                    "the 1 object(s) already uploaded were removed and nothing older"),
        "after 4": ({"SIGTERM_AFTER_PUTS": 4},
                    "the 4 object(s) already uploaded were removed and nothing older"),
    }
    for case, (env, phrase) in cases.items():
        _terminated(_convert(hf_dir, output, **env), phrase, output)
        assert _objects(bucket) == before, case
    done = run_in_process("convert", "--from-hf", hf_dir, "--output", output)
    assert done.returncode == 0, done.stderr
    assert remote_publish.UNFINISHED not in _objects(output)
    assert loading.load(output).encoder.num_layers == 2


def test_a_removal_the_server_does_not_answer_names_what_remains_and_overwrite_clears_it(
        gcs, hf_dir, bucket):
    output = f"{bucket}/converted"
    started = time.monotonic()
    try:
        done = _convert(hf_dir, output, SIGTERM_AFTER_PUTS=3, STOP_PID=gcs.proc.pid)
    finally:
        gcs.resume()
    line = _terminated(done, "up to 4 partial object(s) remain at", output,
                       f"`gsutil -m rm -r {output}`", "re-run with --overwrite")
    assert time.monotonic() - started < BOUND_S, line
    left = _objects(output)
    # 3 objects and the marker, less the one removal in flight when the server stopped, if the
    # server carried it out once it went on
    assert len(left) in (3, 4) and remote_publish.UNFINISHED in left, left
    refused = run_in_process("convert", "--from-hf", hf_dir, "--output", output)
    assert refused.returncode == 2 and refused.stderr.count("\n") == 1, refused.stderr
    assert "holds an unfinished upload of a model export" in refused.stderr
    assert "re-run with --overwrite" in refused.stderr and _objects(output) == left
    again = run_in_process("convert", "--from-hf", hf_dir, "--output", output, "--overwrite")
    assert again.returncode == 0, again.stderr
    assert remote_publish.UNFINISHED not in _objects(output)
    assert loading.load(output).encoder.num_layers == 2


def test_export_over_an_existing_export_says_what_state_the_old_one_is_in(hf_dir, bucket,
                                                                          tmp_path):
    converted = str(tmp_path / "converted")
    assert run_in_process("convert", "--from-hf", hf_dir, "--output", converted).returncode == 0
    output = f"{bucket}/hf"
    first = run_in_process("export", "--workdir", converted, "--format", "hf", "--output", output)
    assert first.returncode == 0, first.stderr
    before = _objects(bucket)

    export = ("bertjax.cli.export", "--workdir", converted, "--format", "hf", "--output", output,
              "--overwrite")
    during_work = _child(*export, SIGTERM_IN="bertjax.interop.hf_files:write_model")
    _terminated(during_work, "nothing was uploaded or changed")
    assert _objects(bucket) == before
    before_upload = _child(*export, SIGTERM_IN="bertjax.core.remote_publish:Upload._mark")
    _terminated(before_upload, "nothing was replaced: the old output is unchanged")
    assert _objects(bucket) == before

    midway = _child(*export, SIGTERM_AFTER_PUTS=1)
    line = _terminated(midway, f"the old model export (bertjax.json or config.json) at {output} "
                       "is no longer whole", "re-run with --overwrite")
    after = _objects(bucket)
    assert f"hf/{remote_publish.UNFINISHED}" in after
    assert "config.json" not in _objects(output), line  # its record went first
    assert {n: m for n, m in after.items() if not n.startswith("hf/")} == \
        {n: m for n, m in before.items() if not n.startswith("hf/")}
    again = run_in_process("export", "--workdir", converted, "--format", "hf", "--output", output,
                           "--overwrite")
    assert again.returncode == 0, again.stderr
    assert _objects(bucket) == before  # the same export again, whole, nothing stale


def test_embed_stopped_while_embedding_or_uploading_leaves_nothing(hf_dir, bucket, tmp_path):
    converted = str(tmp_path / "converted")
    assert run_in_process("convert", "--from-hf", hf_dir, "--output", converted).returncode == 0
    texts = tmp_path / "texts.txt"
    texts.write_text("the river flows\npast the old bridge\n")
    output = f"{bucket}/vectors.npy"
    embed = ("bertjax.cli.embed", "--model", converted, "--input", str(texts), "--output", output,
             "--pooling", "mean")
    before = _objects(bucket)
    _terminated(_child(*embed, SIGTERM_IN="bertjax.cli.model_options:load_model"),
                "nothing was uploaded or changed")
    assert _objects(bucket) == before
    _terminated(_child(*embed, SIGTERM_AFTER_PUTS=1),
                "the 1 object(s) already uploaded were removed")
    assert _objects(bucket) == before
    done = run_in_process("embed", *embed[1:])
    assert done.returncode == 0, done.stderr
    assert set(_objects(bucket)) == set(before) | {"vectors.npy"}


def test_prepare_stopped_while_uploading_its_corpus_says_so_and_the_rerun_completes_it(
        bucket, tmp_path, bert_vocab_path):
    """A prepared corpus is not a staged output: its working copy on this host is kept (a
    preparation resumes), and what was uploaded without the manifest is completed by the rerun."""
    text = tmp_path / "text.txt"
    text.write_text("The cat sat on the mat.\nIt was warm.\n\nA dog ran by the river.\n")
    output = f"{bucket}/prepared"
    prepare = ("bertjax.cli.prepare", "--input", str(text), "--output", output, "--vocab",
               bert_vocab_path, "--workers", "1", "--no-progress")
    stopped = _child(*prepare, SIGTERM_AFTER_TREE_OBJECTS=2)
    _terminated(stopped, f"uploading the prepared corpus to {output}: 2 of its objects are there "
                "without its manifest.json", "the same command again completes the upload")
    assert len(_objects(output)) == 2 and "manifest.json" not in _objects(output)
    done = run_in_process("data.prepare", *prepare[1:])
    assert done.returncode == 0, done.stderr
    assert "manifest.json" in _objects(output) and len(_objects(output)) > 2


def test_a_storage_error_midway_is_one_line_saying_what_became_of_the_upload(
        hf_dir, bucket, monkeypatch):
    before = _objects(bucket)
    put, calls = remote_publish.put_object, []

    def put_then_fail(*args):
        calls.append(args)
        if len(calls) == 3:
            raise ConnectionResetError("connection reset by peer")
        put(*args)

    monkeypatch.setattr(remote_publish, "put_object", put_then_fail)
    output = f"{bucket}/converted"
    done = run_in_process("convert", "--from-hf", hf_dir, "--output", output)
    assert done.returncode == 2 and done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith(f"bertjax: error: cannot write {output}: connection reset")
    assert "the 2 object(s) already uploaded were removed and nothing older was changed" in \
        done.stderr
    assert _objects(bucket) == before
