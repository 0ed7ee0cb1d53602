"""The catalog's bucket section: a damaged object of each kind in a gs:// workdir or corpus.

Each case damages one object of a finished run on a bucket (checkpoints 3 and 6, its corpus
prepared into the same bucket) and runs the command that reads it, as a real process. Damage the
local-disk catalog recovers from (test_checkpoints.py, test_runs.py: an unreadable checkpoint is
set aside and the previous one resumed) is recovered from here too, with its note line; the rest
is refused in one line naming the object's URL, exit 2. Every object that was there before keeps
its md5 except what the recovery documents, and the whole section runs on a server that answers
501 to rewrite, move and copy requests: nothing may depend on them.
"""

import json
import os
import time

import pytest

from bertjax.core import storage, transfer
from bertjax.inference import loading
from bertjax.train.bucket_lock import BucketLock
from gcs_emulator import GcsEmulator, environment_of
from pretrain_runs import SHORT, run_child, run_cli, tiny_args

pytestmark = pytest.mark.gcs

REFUSED = ("rewriteTo", "moveTo", "copyTo")
TIMEOUT_S = 60  # BERTJAX_STORAGE_TIMEOUT here, as for the session's server (conftest.py)
REFUSAL_BOUND_S = TIMEOUT_S + 60  # a refusal: the timeout, and a process's start-up as margin
RESUME_BOUND_S = 240  # a recovery: a run resumed for one or two steps, compile included
GARBAGE = b"\x00\xff garbage {{{ not json"


@pytest.fixture(scope="module")
def server():
    """A server of its own that lacks rewrite, move and copy, with os.environ pointing at it
    (the children inherit it) while the module runs."""
    with GcsEmulator(refuse=REFUSED) as emulator, environment_of(emulator, TIMEOUT_S):
        storage.bound_gcs_requests()
        yield emulator


@pytest.fixture(scope="module")
def pristine(server, small_corpus_dir):
    """Every object of a bucket holding `corpus/` (the tests' small prepared corpus) and `run/`
    (a finished 6-step run on it), by name: what each case's own bucket starts from."""
    bucket = f"gs://{server.new_bucket('pristine')}"
    for root, _, files in os.walk(small_corpus_dir):
        for name in files:
            local = os.path.join(root, name)
            with open(local, "rb") as f:
                storage.write_bytes(f"{bucket}/corpus/{os.path.relpath(local, small_corpus_dir)}",
                                    f.read())
    done = run_child(tiny_args(f"{bucket}/run", f"{bucket}/corpus", **SHORT))
    assert done.returncode == 0, done.stderr[-3000:]
    fs, inner = storage.filesystem(bucket)
    return {name: fs.cat_file(f"{inner}/{name}") for name in transfer.remote_files(bucket)}


@pytest.fixture
def bucket(server, pristine):
    url = f"gs://{server.new_bucket('case')}"
    fs, inner = storage.filesystem(url)
    fs.pipe({f"{inner}/{name}": data for name, data in pristine.items()})
    return url


def md5s(url):
    return {name: entry["md5"] for name, entry in transfer.remote_files(url).items()}


def resume(bucket, steps, every=3):
    """`python -m bertjax.main` resuming the bucket's run to `steps`, saving every `every` steps,
    and the seconds it took."""
    args = tiny_args(f"{bucket}/run", f"{bucket}/corpus", **{
        **SHORT, "train.steps": steps, "train.checkpoint_every": every})
    started = time.monotonic()
    done = run_child(args)
    return done, time.monotonic() - started


def stderr_lines(done):
    # TensorStore's own line, once per process that has no Google credentials (the emulator's).
    return [line for line in done.stderr.splitlines() if "google_auth_provider" not in line]


def refused_in_one_line(done, seconds, *phrases):
    lines = stderr_lines(done)
    assert done.returncode == 2, done.stderr[-3000:]
    assert len(lines) == 1 and lines[0].startswith("bertjax: error: "), lines[-20:]
    assert seconds < REFUSAL_BOUND_S
    for phrase in phrases:
        assert phrase in lines[0], lines[0]
    return lines[0]


def largest_chunk(bucket, step):
    """The largest parameter chunk object of checkpoint `step` (a zarr chunk: one object each;
    a parameter's, so that export reads it too)."""
    found = transfer.remote_files(f"{bucket}/run/checkpoints/{step}/state")
    chunks = {name: entry["size"] for name, entry in found.items()
              if name.startswith("params.") and not os.path.basename(name).startswith(".")}
    return f"{bucket}/run/checkpoints/{step}/state/{max(chunks, key=chunks.get)}"


def damage_metadata(bucket):
    storage.write_bytes(f"{bucket}/run/checkpoints/6/state/_METADATA", GARBAGE)


def truncate_chunk(bucket):
    chunk = largest_chunk(bucket, 6)
    data = storage.read_bytes(chunk)
    storage.write_bytes(chunk, data[:len(data) // 2])


@pytest.mark.parametrize("damage", [damage_metadata, truncate_chunk])
def test_an_unreadable_checkpoint_is_set_aside_without_moving_it_and_the_run_resumes(
        bucket, damage):
    """As on a disk (the previous checkpoint resumed, the damaged one kept), but set aside by a
    record and the deletion of its commit marker: no copy or move, which this server refuses."""
    damage(bucket)
    before = md5s(bucket)
    done, seconds = resume(bucket, 7, every=4)  # saves 4 and 7: step 6's objects stay as they are
    assert done.returncode == 0, done.stderr[-3000:]
    assert seconds < RESUME_BOUND_S
    checkpoints = f"{bucket}/run/checkpoints"
    record = f"{checkpoints}/6.unreadable.json"
    notes = [line for line in stderr_lines(done) if "unreadable" in line]
    assert len(notes) == 1 and notes[0].startswith("checkpoint 6 is unreadable ("), notes
    assert notes[0].endswith(f"); resuming from 3; its objects stay under {checkpoints}/6/ until "
                             f"step 6 is saved again ({record} says why)"), notes
    assert not any(word in done.stderr for word in ("Traceback", "ERROR", "gcsfs")), \
        done.stderr[-3000:]
    after = md5s(bucket)
    marker = "run/checkpoints/6/commit_success.txt"
    assert marker in before and marker not in after
    for name in before:  # the checkpoints and the corpus, byte for byte
        if name.startswith(("run/checkpoints/", "corpus/")) and name != marker:
            assert after.get(name) == before[name], name
    assert loading.checkpoint_steps(f"{bucket}/run") == [3, 4, 7]
    said = json.loads(storage.read_bytes(record))
    assert said["step"] == 6 and said["objects"] == f"{checkpoints}/6/" and said["reason"]
    assert said["reason"] in notes[0]


def test_a_step_set_aside_on_a_bucket_is_saved_again_and_its_record_kept(bucket, pristine):
    damage_metadata(bucket)
    done, _ = resume(bucket, 8)  # from 3: saves 6 (over the set-aside objects) and 8
    assert done.returncode == 0, done.stderr[-3000:]
    assert "checkpoint 6 is unreadable" in done.stderr
    checkpoints = f"{bucket}/run/checkpoints"
    assert loading.checkpoint_steps(f"{bucket}/run") == [3, 6, 8]
    assert sorted(storage.listdir(checkpoints)) == ["3", "6", "6.unreadable.json", "8"]
    assert json.loads(storage.read_bytes(f"{checkpoints}/6.unreadable.json"))["step"] == 6
    saved = set(transfer.remote_files(f"{checkpoints}/6"))  # the new save's, nothing stale
    assert saved == {name[len("run/checkpoints/6/"):] for name in pristine
                     if name.startswith("run/checkpoints/6/")}
    assert storage.read_bytes(f"{checkpoints}/6/state/_METADATA") != GARBAGE
    again, _ = resume(bucket, 9)
    assert again.returncode == 0 and "resuming from step 8" in again.stderr, again.stderr[-3000:]


def test_a_damaged_checkpoint_is_one_line_for_export(bucket, tmp_path):
    """A reader (export) sets nothing aside: as on a disk, one line naming the checkpoint."""
    truncate_chunk(bucket)
    before = md5s(bucket)
    output = str(tmp_path / "out")
    started = time.monotonic()
    done = run_cli("bertjax.export", "--workdir", f"{bucket}/run", "--format", "params",
                   "--output", output)
    seconds = time.monotonic() - started
    refused_in_one_line(done, seconds, "cannot read the checkpoint", f"{bucket}/run")
    assert md5s(bucket) == before and not os.path.exists(output)


def garble(name, data=GARBAGE):
    return lambda bucket: storage.write_bytes(f"{bucket}/{name}", data)


def garble_metrics_line(bucket):
    url = f"{bucket}/run/metrics.jsonl"
    lines = storage.read_bytes(url).split(b"\n")
    lines[1] = GARBAGE
    storage.write_bytes(url, b"\n".join(lines))


@pytest.mark.parametrize("damage, phrases", [
    (garble("run/run.json", b'{"not": valid json'), ["{bucket}/run/run.json"]),
    (garble_metrics_line, ["{bucket}/run/metrics.jsonl line 2 is not a metrics record"]),
    (garble("corpus/manifest.json", b'{"not": valid json'), ["{bucket}/corpus/manifest.json"]),
    (garble("run/.lock"), ["the lock {bucket}/run/.lock holds no lease note bertjax wrote"]),
], ids=["run-record", "metrics-line", "corpus-manifest", "lease"])
def test_a_damaged_record_is_refused_in_one_line_naming_its_url(bucket, damage, phrases):
    damage(bucket)
    before = md5s(bucket)
    done, seconds = resume(bucket, 8)
    refused_in_one_line(done, seconds, *(p.format(bucket=bucket) for p in phrases))
    assert md5s(bucket) == before


def test_a_metrics_record_cut_short_is_dropped_on_resume_with_a_line(bucket):
    """What a killed run can leave: the last line without its newline. The resume drops it, as it
    drops every record after its checkpoint, and says so."""
    url = f"{bucket}/run/metrics.jsonl"
    storage.write_bytes(url, storage.read_bytes(url) + b'{"step": 7, "lo')
    done, _ = resume(bucket, 8)
    assert done.returncode == 0, done.stderr[-3000:]
    assert f"{url}: its last line was a record cut short; dropped" in done.stderr
    records = [json.loads(line) for line in storage.read_bytes(url).splitlines()]
    assert [r["step"] for r in records] == list(range(1, 9))


def test_an_old_lock_object_without_a_lease_note_is_taken_over(bucket, capsys):
    storage.write_bytes(f"{bucket}/run/.lock", GARBAGE)
    time.sleep(2)
    with BucketLock(f"{bucket}/run", stale_s=1) as lock:
        assert lock.held
    assert capsys.readouterr().err.startswith(
        f"bertjax: taking over the lock of {bucket}/run: its holder (another process) left no "
        "note; the object is ")
    assert not storage.exists(f"{bucket}/run/.lock")
