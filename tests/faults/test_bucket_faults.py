"""The bucket section of the catalog: a storage server that stops answering (frozen, SIGSTOP) or
is gone (killed, SIGKILL) at five points of a run, of an export, of a convert and of an embed.

Each point is a storage request, counted by the server itself (tests/gcs_emulator.py
fault_after): the fractions below of the requests the command makes when nothing goes wrong.
Each case checks that the command ends with one line on stderr and exit status 2, within the
storage timeout plus a margin of the fault; that no object it found there changed (the server's
md5s at the moment of the fault, recorded by the server, so a killed one too); and that whatever
half-written objects it left are named by its line.
"""

import json
import os
import re
import subprocess
import sys
import time

import fsspec
import pytest

from gcs_emulator import GcsEmulator
from hf_reference import save_hf_dir
from pretrain_runs import REPO, SHORT, child_env, tiny_args
from test_convert import random_bert

pytestmark = pytest.mark.gcs

TIMEOUT_S = 3  # BERTJAX_STORAGE_TIMEOUT of the commands
MARGIN_S = 12  # the end of a command after its deadline: the watchdog's poll, the exit
POINTS = (0.05, 0.25, 0.5, 0.75, 0.9)
BUCKET = "faults"  # one name on every server: each case's requests are those of the clean run


def _fs(server):
    return fsspec.filesystem("gs", endpoint_url=server.url, token="anon", requests_timeout=60,
                             skip_instance_cache=True, use_listings_cache=False)


@pytest.fixture(scope="module")
def template(gcs, small_corpus_dir, tmp_path_factory):
    """The objects of a 3-step run on a bucket (checkpoint 3), and the local inputs the commands
    read: the corpus, a small Hugging Face model and a text file."""
    bucket = gcs.new_bucket("template")
    args = tiny_args(f"gs://{bucket}/run", small_corpus_dir, **{**SHORT, "train.steps": 3})
    done = subprocess.run([sys.executable, "-m", "bertjax.main", *args[1:]], cwd=REPO,
                          env=child_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    fs = fsspec.filesystem("gs")
    objects = {name[len(bucket) + 1:]: fs.cat_file(name)
               for name in fs.find(f"{bucket}/run") if not name.endswith("/.lock")}
    objects["texts.txt"] = b"a moving and funny film\nthe plot is thin\n"
    root = tmp_path_factory.mktemp("bucket_faults")
    vocab = os.path.join(small_corpus_dir, "tokenizer", "vocab.txt")
    hf_dir = save_hf_dir(root / "hf", random_bert(32, 2, 37, 2, vocab=1000), vocab)
    return {"objects": objects, "corpus": small_corpus_dir, "hf": str(hf_dir)}


def _commands(template):
    """name -> (arguments of `python -m bertjax.X`, the objects it must leave as they were)."""
    workdir = f"gs://{BUCKET}/run"
    run = tiny_args(workdir, template["corpus"], **SHORT)[1:]
    return {
        "run": (["bertjax.main", *run], lambda name: name.startswith("run/checkpoints/3/")),
        "export": (["bertjax.export", "--workdir", workdir, "--format", "hf",
                    "--output", f"gs://{BUCKET}/export"], lambda name: True),
        "convert": (["bertjax.convert", "--from-hf", template["hf"],
                     "--output", f"gs://{BUCKET}/converted"], lambda name: True),
        "embed": (["bertjax.embed", "--model", workdir, "--input", f"gs://{BUCKET}/texts.txt",
                   "--pooling", "mean", "--output", f"gs://{BUCKET}/vectors.npy"],
                  lambda name: True),
    }


def _serve(template):
    server = GcsEmulator()
    server.create_bucket(BUCKET)
    fs = _fs(server)
    for name, data in template["objects"].items():
        fs.pipe_file(f"{BUCKET}/{name}", data)
    return server


def _run(server, args, cache, wait_s=240):
    env = child_env(**server.env(), BERTJAX_STORAGE_TIMEOUT=str(TIMEOUT_S), BERTJAX_CACHE=cache)
    process = subprocess.Popen([sys.executable, "-m", *args], cwd=REPO, env=env, text=True,
                               stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    try:
        out, err = process.communicate(timeout=wait_s)
    except subprocess.TimeoutExpired:
        process.kill()
        out, err = process.communicate()
        pytest.fail(f"{args[0]} still running {wait_s}s after its start: {err[-3000:]}")
    return process.returncode, err, time.time()


@pytest.fixture(scope="module")
def clean_requests(template, tmp_path_factory):
    """How many storage requests each command makes when nothing goes wrong."""
    counts = {}
    for name, (args, _) in _commands(template).items():
        with _serve(template) as server:
            before = server.requests_answered()
            cache = str(tmp_path_factory.mktemp(f"clean_{name}"))
            code, err, _ = _run(server, args, cache)
            assert code == 0, err[-3000:]
            counts[name] = server.requests_answered() - before
    return counts


def _half_written(before: dict, after: dict) -> list[str]:
    """New objects that are not whole: anything new but a run's records and complete checkpoints
    (those with their commit marker)."""
    new = [name for name in after if name not in before]
    complete = {name.rsplit("/", 1)[0] for name in after if name.endswith("/commit_success.txt")}
    # The lease of a run that ended stays: the next run on this host takes it over at once.
    records = ("run.json", "metrics.jsonl", "tensorboard/", ".lock")
    return [name for name in new
            if not any(name.startswith(f"{BUCKET}/run/{r}") for r in records)
            and not any(name.startswith(step + "/") for step in complete)]


def _line(err: str) -> str:
    lines = [line for line in err.splitlines() if "google_auth_provider" not in line
             and not line.startswith(("step ", "compiled ", "resuming ", "note: "))]
    errors = [line for line in lines if line.startswith("bertjax: error:")]
    assert "Traceback" not in err and len(errors) == 1, err[-3000:]
    return errors[0]


@pytest.mark.parametrize("kind", ["stop", "kill"])
@pytest.mark.parametrize("point", POINTS)
@pytest.mark.parametrize("command", ["run", "export", "convert", "embed"])
def test_a_storage_server_that_stops_or_dies_mid_command(template, clean_requests, command,
                                                         point, kind, tmp_path):
    args, kept = _commands(template)[command]
    record = str(tmp_path / "fault.json")
    with _serve(template) as server:
        before = server.object_md5s()
        server.fault_after(int(clean_requests[command] * point), kind, record)
        code, err, ended = _run(server, args, str(tmp_path / "cache"))
        assert os.path.exists(record), f"no fault: the command made fewer requests\n{err[-2000:]}"
        with open(record) as f:
            fault = json.load(f)
    line = _line(err)
    assert code == 2, err[-3000:]
    assert ended - fault["time"] < TIMEOUT_S + MARGIN_S, (ended - fault["time"], line)
    # The deadline's words, or a refused connection's when a dead server's port is seen first.
    reasons = [f"within {TIMEOUT_S}s"] + (["cannot be reached"] if kind == "kill" else [])
    assert any(reason in line for reason in reasons), line
    after = fault["md5s"]
    changed = [name for name, md5 in before.items()
               if kept(name.split("/", 1)[1]) and after.get(name) != md5]
    assert not changed, (changed, line)
    named = [url.rstrip("/:.") for url in re.findall(r"gs://[^\s;,()]+", line)
             if url.rstrip("/:.") not in (f"gs://{BUCKET}", f"gs://{BUCKET}/run")]
    for name in _half_written(before, after):
        assert any(f"gs://{name}".startswith(url + "/") or f"gs://{name}" == url
                   for url in named), (name, line)


def test_a_checkpoint_request_that_times_out_before_the_deadline_says_the_same(gcs, tmp_path):
    """A save whose request times out in the storage client, before the command's deadline,
    reports as the deadline does: the same reason and what stays restorable, said once."""
    import jax.numpy as jnp

    from bertjax.core import storage_deadline
    from bertjax.core.errors import UserError
    from bertjax.train.checkpoint import Checkpointer

    directory = f"gs://{gcs.new_bucket('timeout')}/wd"
    checkpointer = Checkpointer(directory)
    tree = {"w": jnp.ones((8, 8))}
    checkpointer.save(5, tree, {"position": 5})
    checkpointer.wait()

    def times_out(*args, **kwargs):
        raise TimeoutError("injected: no answer")

    checkpointer._manager.save = times_out
    with pytest.raises(UserError) as raised:
        with storage_deadline.unfinished("the run's own account"):
            checkpointer.save(10, tree, {"position": 10})
    reason = f"within {os.environ.get('BERTJAX_STORAGE_TIMEOUT', '30')}s (BERTJAX_STORAGE_TIMEOUT)"
    assert str(raised.value) == (
        f"cannot write checkpoint 10 to {directory}/checkpoints: the storage server did not "
        f"answer {reason}; checkpoint 10 was not saved, checkpoint 5 stays restorable: run the "
        f"same command again once the storage answers (the partial objects under "
        f"{directory}/checkpoints/10 are not listed: the next save of that step replaces them)")
    assert checkpointer.all_steps() == [5]
