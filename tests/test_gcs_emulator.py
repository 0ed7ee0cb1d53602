"""The local GCS server (tests/gcs_emulator.py) and what the storage libraries do against it: the
behaviour bertjax's gs:// support relies on, pinned so that an upgrade that changes it fails here."""

import os
import subprocess
import sys
import time

import pytest

from gcs_emulator import GcsEmulator  # noqa: E402  (tests/ is on sys.path: see the gcs fixture)

pytestmark = pytest.mark.gcs


def test_gcsfs_and_epath_round_trip(gcs, gcs_bucket):
    import fsspec
    from etils import epath

    fs = fsspec.filesystem("gs")
    assert type(fs).__name__ == "GCSFileSystem"  # not ExtendedGcsFileSystem (HNS probe is off)
    path = f"gs://{gcs_bucket}/dir/a.txt"
    fs.pipe(path, b"hello")
    assert fs.cat(path) == b"hello"
    assert fs.exists(path) and fs.ls(f"gs://{gcs_bucket}/dir") == [f"{gcs_bucket}/dir/a.txt"]
    info = fs.info(path)
    assert isinstance(info["generation"], str) and int(info["generation"]) > 0
    fs.rm(path)
    fs.invalidate_cache()
    assert not fs.exists(path)

    p = epath.Path(f"gs://{gcs_bucket}/e/x.json")
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text('{"a": 1}')
    assert p.exists() and p.read_text() == '{"a": 1}'
    assert [q.name for q in p.parent.iterdir()] == ["x.json"]
    p.unlink()
    assert not p.exists()


def test_exclusive_create_and_generation_conditions_with_gcsfs(gcs, gcs_bucket):
    import fsspec

    fs = fsspec.filesystem("gs")
    lock = f"{gcs_bucket}/lock"
    fs.pipe(lock, b"holder-1", mode="create")  # ifGenerationMatch=0
    with pytest.raises(FileExistsError):
        fs.pipe(lock, b"holder-2", mode="create")
    with pytest.raises(FileExistsError):
        with fs.open(lock, "xb") as f:
            f.write(b"holder-2")
    gen = int(fs.info(lock)["generation"])
    upload = f"{fs._location}/upload/storage/v1/b/{gcs_bucket}/o"
    # A conditional rewrite: gcsfs has no public API, its _call passes extra kwargs as query
    # parameters. 412 comes back as FileExistsError (for any failed precondition).
    with pytest.raises(FileExistsError):
        fs.call("POST", upload, uploadType="media", name="lock", data=b"x",
                ifGenerationMatch=str(gen + 1))
    fs.call("POST", upload, uploadType="media", name="lock", data=b"holder-1 again",
            ifGenerationMatch=str(gen))
    fs.invalidate_cache()
    new_gen = int(fs.info(lock)["generation"])
    assert new_gen != gen and fs.cat(lock) == b"holder-1 again"
    with pytest.raises(FileExistsError):  # a conditional delete on a stale generation
        fs.call("DELETE", "b/{}/o/{}", gcs_bucket, "lock", ifGenerationMatch=str(gen))
    fs.call("DELETE", "b/{}/o/{}", gcs_bucket, "lock", ifGenerationMatch=str(new_gen))
    fs.invalidate_cache()
    assert not fs.exists(lock)


def test_generation_conditions_with_google_cloud_storage(gcs, gcs_bucket):
    from google.api_core.exceptions import PreconditionFailed
    from google.auth.credentials import AnonymousCredentials
    from google.cloud import storage

    client = storage.Client(project="test", credentials=AnonymousCredentials())
    bucket = client.bucket(gcs_bucket)
    blob = bucket.blob("lock")
    blob.upload_from_string(b"a", if_generation_match=0)
    first = blob.generation
    with pytest.raises(PreconditionFailed):
        bucket.blob("lock").upload_from_string(b"b", if_generation_match=0)
    refreshed = bucket.blob("lock")
    refreshed.upload_from_string(b"c", if_generation_match=first)
    with pytest.raises(PreconditionFailed):  # the old holder refreshing a lock taken over
        bucket.blob("lock").upload_from_string(b"d", if_generation_match=first)
    with pytest.raises(PreconditionFailed):
        bucket.blob("lock").delete(if_generation_match=first)
    current = bucket.get_blob("lock")
    assert current.generation == refreshed.generation and current.download_as_bytes() == b"c"
    bucket.blob("lock").delete(if_generation_match=current.generation)
    assert bucket.get_blob("lock") is None
    big = os.urandom(9 * 2**20)  # over the client's 8 MiB threshold: a resumable upload
    bucket.blob("big").upload_from_string(big, if_generation_match=0)
    with pytest.raises(PreconditionFailed):
        bucket.blob("big").upload_from_string(big, if_generation_match=0)


def test_the_stock_emulator_ignores_preconditions():
    """Why GcsEmulator patches the emulator by default: unpatched, "create" overwrites."""
    import gcsfs

    with GcsEmulator(preconditions=False) as stock:
        fs = gcsfs.GCSFileSystem(token="anon", endpoint_url=stock.url, skip_instance_cache=True)
        b = stock.new_bucket()
        fs.pipe(f"{b}/x", b"1", mode="create")
        fs.pipe(f"{b}/x", b"2", mode="create")  # no FileExistsError
        assert fs.cat(f"{b}/x") == b"2"


def test_orbax_checkpoint_manager_on_gcs(gcs, gcs_bucket):
    import jax
    import jax.numpy as jnp
    import numpy as np
    import orbax.checkpoint as ocp

    def handlers():
        return {"state": ocp.StandardCheckpointHandler(), "data": ocp.JsonCheckpointHandler()}

    directory = f"gs://{gcs_bucket}/run/checkpoints"
    state = {"w": jnp.arange(12.0).reshape(3, 4), "step": jnp.array(7)}
    start = time.monotonic()
    manager = ocp.CheckpointManager(directory, item_handlers=handlers(),
                                    options=ocp.CheckpointManagerOptions(
                                        enable_async_checkpointing=True, max_to_keep=None))
    manager.save(3, args=ocp.args.Composite(state=ocp.args.StandardSave(state),
                                            data=ocp.args.JsonSave({"position": 5})))
    manager.wait_until_finished()
    assert manager.all_steps() == [3]
    manager.close()
    fresh = ocp.CheckpointManager(directory, item_handlers=handlers())
    assert fresh.all_steps() == [3]
    abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, state)
    restored = fresh.restore(3, args=ocp.args.Composite(state=ocp.args.StandardRestore(abstract),
                                                        data=ocp.args.JsonRestore()))
    fresh.close()
    assert restored["data"] == {"position": 5}
    np.testing.assert_array_equal(restored["state"]["w"], state["w"])
    assert time.monotonic() - start < 15


def test_a_write_conditioned_on_a_reads_generation_is_accepted(gcs, gcs_bucket):
    """A download names the object's generation, as Cloud Storage's do: tensorstore conditions
    its next write on it (OCDBT's manifest), and took a missing one for 0 ("Malformed
    StorageGeneration", a checkpoint save failing now and then)."""
    import tensorstore as ts

    kv = ts.KvStore.open({"driver": "gcs", "bucket": gcs_bucket}).result()
    written = kv.write("manifest.ocdbt", b"1").result()
    read = kv.read("manifest.ocdbt").result()
    assert read.value == b"1" and read.stamp.generation == written.generation
    rewritten = kv.write("manifest.ocdbt", b"2", if_equal=read.stamp.generation).result()
    assert rewritten.generation not in (written.generation, b"")
    assert kv.read("manifest.ocdbt").result().value == b"2"


def test_a_missing_bucket_fails_at_once(gcs):
    import fsspec
    import jax.numpy as jnp
    import orbax.checkpoint as ocp

    fs = fsspec.filesystem("gs")
    start = time.monotonic()
    assert fs.exists("no-such-bucket-0/x") is False  # exists() does not raise
    with pytest.raises(FileNotFoundError):
        fs.ls("no-such-bucket-0/")
    with pytest.raises(FileNotFoundError):
        fs.pipe("no-such-bucket-0/x", b"1")
    manager = ocp.CheckpointManager("gs://no-such-bucket-0/run/checkpoints",
                                    item_handlers={"state": ocp.StandardCheckpointHandler()})
    # Which write fails first varies: gcsfs (FileNotFoundError) or tensorstore (ValueError NOT_FOUND).
    with pytest.raises((FileNotFoundError, ValueError), match="no-such-bucket-0|Not Found"):
        manager.save(1, args=ocp.args.Composite(state=ocp.args.StandardSave({"w": jnp.ones(4)})))
        manager.wait_until_finished()
    assert time.monotonic() - start < 15  # 0.4 s unloaded; the rest is imports and load


def test_a_server_that_stops_answering_times_out_with_requests_timeout():
    """SIGSTOP: connections are accepted, nothing answers. Without requests_timeout gcsfs waits for
    minutes; with it, one FSTimeoutError after that many seconds (timeouts are not retried)."""
    import fsspec.exceptions
    import gcsfs

    with GcsEmulator() as server:
        fs = gcsfs.GCSFileSystem(token="anon", endpoint_url=server.url, requests_timeout=1,
                                 skip_instance_cache=True)
        b = server.new_bucket()
        fs.pipe(f"{b}/x", b"1")
        server.pause()
        start = time.monotonic()
        with pytest.raises(fsspec.exceptions.FSTimeoutError):
            fs.cat(f"{b}/x")
        assert time.monotonic() - start < 3
        server.resume()
        assert fs.cat(f"{b}/x") == b"1"


def test_s3_without_s3fs_names_the_package():
    code = ("import fsspec\n"
            "from etils import epath\n"
            "for f in (lambda: fsspec.filesystem('s3'), lambda: epath.Path('s3://b/x').exists()):\n"
            "    try: f()\n"
            "    except ImportError as e: print(e)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.stdout.splitlines() == ["Install s3fs to access S3"] * 2, out
