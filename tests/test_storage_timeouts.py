"""A bucket that stops answering is an error for every question asked of it, never an answer:
fsspec's own isdir/isfile say False for any error, so a listing that timed out looked empty (and a
failed run on a bucket would then remove a workdir whose checkpoints it could not list)."""

import concurrent.futures
import time

import fsspec
import pytest

from bertjax.core import storage, transfer
from bertjax.core.errors import UserError
from gcs_emulator import GcsEmulator  # noqa: E402  (tests/ is on sys.path)

pytestmark = pytest.mark.gcs


@pytest.fixture
def frozen_bucket(monkeypatch):
    """A run's checkpoint 3 on a bucket of a server of its own, asked with a 1 s timeout."""
    with GcsEmulator() as server:
        for name, value in server.env().items():
            monkeypatch.setenv(name, value)
        monkeypatch.setenv("BERTJAX_STORAGE_TIMEOUT", "1")
        # A fresh gs:// configuration for this server (the suite's own points at another).
        monkeypatch.setitem(fsspec.config.conf, "gs", {"endpoint_url": server.url})
        bucket = f"gs://{server.new_bucket()}"
        storage.write_bytes(f"{bucket}/run/checkpoints/3/commit_success.txt", b"done")
        yield server, bucket


def _seconds_to_refusal(ask, path) -> float:
    started = time.monotonic()
    with pytest.raises(UserError, match="did not answer within 1s"):
        ask(path)
    return time.monotonic() - started


def test_questions_to_a_server_that_stops_answering_are_errors(frozen_bucket):
    server, bucket = frozen_bucket
    checkpoints = f"{bucket}/run/checkpoints"
    marker = f"{checkpoints}/3/commit_success.txt"
    assert storage.isdir(checkpoints) and storage.listdir(checkpoints) == ["3"]
    assert storage.isfile(marker) and not storage.isfile(checkpoints)
    assert set(transfer.remote_files(checkpoints)) == {"3/commit_success.txt"}
    server.pause()
    try:
        # Asked all at once (as a run's threads may): each gives up on its own after its 1 s.
        with concurrent.futures.ThreadPoolExecutor(5) as pool:
            waits = {ask: pool.submit(_seconds_to_refusal, ask, path) for ask, path in (
                (storage.isdir, checkpoints), (storage.listdir, checkpoints),
                (storage.isfile, marker), (storage.exists, marker),
                (transfer.remote_files, marker))}
        for ask, seconds in waits.items():
            assert seconds.result() < 10, ask
    finally:
        server.resume()
    # The requests given up on are still queued at the server: answers may take a moment.
    fsspec.config.conf["gs"]["requests_timeout"] = 30
    assert storage.listdir(checkpoints) == ["3"] and storage.isfile(marker)
    assert not storage.isdir(f"{bucket}/nothing") and storage.listdir(f"{bucket}/nothing") == []
