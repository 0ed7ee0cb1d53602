"""A real GCS JSON-API server on localhost for the tests: `gcp-storage-emulator`, in memory, in a
child process of its own (so that a test can pause it with SIGSTOP, as a storage server that stops
answering, or kill it, as one that is gone).

    with GcsEmulator() as gcs:
        gcs.create_bucket("b")
        os.environ.update(gcs.env())      # or pass gcs.env() to a child process
        fsspec.filesystem("gs").pipe("gs://b/x", b"data")

The child binds 127.0.0.1 port 0 and prints the port the kernel gave it, so two pytest-xdist
workers (or any number of emulators) never race for a port.

Preconditions. The stock emulator (2026.7.19) ignores `ifGenerationMatch` entirely: an "exclusive
create" (gcsfs `mode="create"`, `open(..., "xb")`) silently overwrites and a conditional rewrite or
delete always succeeds. Real GCS answers 412 Precondition Failed. With `preconditions=True` (the
default) the child wraps the object handlers so `ifGenerationMatch` / `ifGenerationNotMatch` (query
parameters of the JSON API, which is what gcsfs, google-cloud-storage and tensorstore use) are
honoured as GCS does, 412 with reason "conditionNotMet". The server handles one request at a time,
so the check and the write are atomic, as on GCS.

Faults at an exact point. The server counts the storage requests it takes; `fault_after(n,
kind, record)` makes it stop answering (SIGSTOP) or die (SIGKILL) just before it would answer
the n+1-th from then on, first writing to `record` the time and the md5 of every object it
holds: what a killed server held is known even though its memory is gone.

Who wrote what: `changes()` lists every object created or deleted with the Host header of the
request that did it, so clients that name the server differently (127.0.0.1, localhost) are told
apart.

A server that lacks operations: `GcsEmulator(refuse=("rewriteTo", "moveTo", "copyTo"))` answers
501 Not Implemented to those object routes, as some GCS-compatible stores do.
"""

from __future__ import annotations

import contextlib
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid

HOST = "127.0.0.1"
START_TIMEOUT_S = 15.0
FAULTS = "/_faults"  # the fault injector's own requests (not counted, never faulted)
BODY_BYTES = "/_body_bytes"  # asks the server how many response-body bytes it has sent


def emulator_env(host: str) -> dict[str, str]:
    """Environment variables that point gcsfs, google-cloud-storage and tensorstore (Orbax) at an
    emulator at `host` ("127.0.0.1:PORT") and keep every client away from credentials look-ups."""
    return {
        # gcsfs adds "http://" when the value has no scheme; google-cloud-storage accepts both.
        "STORAGE_EMULATOR_HOST": f"http://{host}",
        # tensorstore's "gcs" driver (Orbax); with it set tensorstore sends no credentials at all.
        "TENSORSTORE_GCS_HTTP_URL": f"http://{host}",
        # google.auth and gcsfs: never probe the GCE metadata server (169.254.169.254). Must be
        # exactly "true" and set before google.auth is imported (it is read at import time).
        "NO_GCE_CHECK": "true",
        # A project for google-cloud-storage / gcsfs so neither looks one up.
        "GOOGLE_CLOUD_PROJECT": "test",
        # gcsfs >= 2025.x defaults this to true and then uses ExtendedGcsFileSystem, which asks each
        # bucket for its layout over gRPC before the first write (slow, and meaningless here).
        # Read when gcsfs is imported.
        "GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT": "false",
    }


@contextlib.contextmanager
def environment_of(emulator: "GcsEmulator", timeout_s: float):
    """os.environ pointing at `emulator` (child processes inherit it), with
    BERTJAX_STORAGE_TIMEOUT=`timeout_s`; the variables it changed put back afterwards."""
    names = ("STORAGE_EMULATOR_HOST", "TENSORSTORE_GCS_HTTP_URL", "GOOGLE_CLOUD_PROJECT",
             "BERTJAX_STORAGE_TIMEOUT")
    saved = {name: os.environ.get(name) for name in names}
    os.environ.update(emulator.env())
    os.environ["BERTJAX_STORAGE_TIMEOUT"] = str(timeout_s)
    try:
        yield emulator
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class GcsEmulator:
    """One gcp-storage-emulator child process on 127.0.0.1 and a free port, storage in memory."""

    def __init__(self, preconditions: bool = True, start_timeout_s: float = START_TIMEOUT_S,
                 refuse: tuple[str, ...] = ()):
        self.preconditions = preconditions
        self._log = tempfile.NamedTemporaryFile(prefix="gcs_emulator_", suffix=".log", delete=False)
        cmd = [sys.executable, os.path.abspath(__file__), "--serve"]
        if preconditions:
            cmd.append("--preconditions")
        if refuse:
            cmd.append("--refuse=" + ",".join(refuse))
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._log,
                                     stdin=subprocess.DEVNULL)
        try:
            self.port = self._read_port(start_timeout_s)
            self.host = f"{HOST}:{self.port}"
            self.url = f"http://{self.host}"
            self._wait_until_answering(start_timeout_s)
        except BaseException:
            self.stop()
            raise

    # -- lifecycle ------------------------------------------------------------------------------

    def _fail(self, what: str) -> RuntimeError:
        self._log.flush()
        with open(self._log.name, encoding="utf-8", errors="replace") as f:
            tail = f.read()[-3000:]
        return RuntimeError(f"gcp-storage-emulator {what} (exit code {self.proc.poll()}); "
                            f"its log ({self._log.name}):\n{tail}")

    def _read_port(self, timeout_s: float) -> int:
        deadline = time.monotonic() + timeout_s
        line = b""
        while not line.endswith(b"\n"):
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._fail(f"did not report its port within {timeout_s:.0f} s")
            ready, _, _ = select.select([self.proc.stdout], [], [], min(left, 0.2))
            if ready:
                byte = os.read(self.proc.stdout.fileno(), 1)  # unbuffered: select sees the rest
                if not byte:
                    raise self._fail("exited before it reported its port")
                line += byte
        text = line.decode().strip()
        if not text.startswith("PORT "):
            raise self._fail(f"printed {text!r} instead of its port")
        return int(text.split()[1])

    def _wait_until_answering(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                with urllib.request.urlopen(self.url + "/", timeout=1) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None:
                raise self._fail("exited while starting")
            if time.monotonic() > deadline:
                raise self._fail(f"did not answer within {timeout_s:.0f} s")
            time.sleep(0.05)

    def stop(self) -> None:
        """Ends the server: SIGTERM, then SIGKILL after 5 s. Safe to call twice, or when paused."""
        if self.proc.poll() is None:
            try:
                os.kill(self.proc.pid, signal.SIGCONT)  # a stopped process would not see SIGTERM
            except ProcessLookupError:
                pass
            self.proc.terminate()
            try:
                self.proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(timeout=5)
        if self.proc.stdout:
            self.proc.stdout.close()
        self._log.close()
        try:
            os.unlink(self._log.name)
        except OSError:
            pass

    def kill(self) -> None:
        """Ends the server at once (SIGKILL): new connections are refused from then on."""
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(timeout=5)

    def pause(self) -> None:
        """SIGSTOP: the port stays open and the kernel still accepts connections (up to the listen
        backlog), but nothing ever answers: a storage server that hangs.

        Returns once every thread has stopped: kill() only queues the signal, and until the thread
        it woke gets a CPU and starts the group stop, the server's other threads run on. On a busy
        machine a request sent just after kill() was answered (7 times in 40, measured)."""
        os.kill(self.proc.pid, signal.SIGSTOP)
        deadline = time.monotonic() + 10.0
        while not self._every_thread_stopped():
            if self.proc.poll() is not None:
                raise self._fail("exited instead of stopping on SIGSTOP")
            if time.monotonic() > deadline:
                raise self._fail("did not stop within 10 s of SIGSTOP")
            time.sleep(0.001)

    def _every_thread_stopped(self) -> bool:
        tasks = f"/proc/{self.proc.pid}/task"
        states = []
        try:
            threads = os.listdir(tasks)
        except FileNotFoundError:  # the process is gone: pause() reports it
            return False
        for tid in threads:
            try:
                with open(f"{tasks}/{tid}/stat", encoding="ascii") as f:
                    states.append(f.read().rsplit(")", 1)[1].split()[0])  # the name may hold spaces
            except FileNotFoundError:  # a thread that has just exited
                pass
        return all(state == "T" for state in states)

    def resume(self) -> None:
        os.kill(self.proc.pid, signal.SIGCONT)

    def __enter__(self) -> "GcsEmulator":
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    # -- use ------------------------------------------------------------------------------------

    def env(self) -> dict[str, str]:
        return emulator_env(self.host)

    def _request(self, method: str, path: str, body: dict | None = None) -> tuple[int, bytes]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(self.url + path, data=data, method=method,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=10) as r:
                return r.status, r.read()
        except urllib.error.HTTPError as e:
            return e.code, e.read()

    def create_bucket(self, name: str) -> str:
        status, content = self._request("POST", "/storage/v1/b?project=test", {"name": name})
        if status != 200:
            raise RuntimeError(f"creating bucket {name!r}: HTTP {status} {content[:300]!r}")
        return name

    def new_bucket(self, prefix: str = "test") -> str:
        """A new bucket with a unique (valid: lower case, 3-63 characters) name."""
        return self.create_bucket(f"{prefix}-{uuid.uuid4().hex[:16]}")

    def wipe(self) -> None:
        self._request("GET", "/wipe")

    # -- faults at an exact request (see _inject_faults) ----------------------------------------

    def requests_answered(self) -> int:
        """How many storage requests the server has taken since it started."""
        return json.loads(self._request("GET", f"{FAULTS}/requests")[1])["requests"]

    def object_md5s(self) -> dict[str, str]:
        """{"bucket/name": md5Hash} of every object held."""
        return json.loads(self._request("GET", f"{FAULTS}/md5s")[1])

    def body_bytes_sent(self) -> int:
        """The bytes of every response body the server has sent (objects, listings, metadata):
        what clients fetched, counted by the server (see _count_body_bytes)."""
        return json.loads(self._request("GET", BODY_BYTES)[1])["bytes"]

    def changes(self) -> list[tuple[str, str, str]]:
        """(the request's Host header, "create" or "delete", "bucket/name") of every object
        written or deleted so far, in order: a client that names the server by another host
        name (localhost) tells its writes apart."""
        return [tuple(c) for c in json.loads(self._request("GET", f"{FAULTS}/changes")[1])]

    def fault_after(self, requests: int, kind: str, record: str) -> None:
        """Arms a fault: the server takes `requests` more requests, then, before answering the
        next, writes `record` (the time and every object's md5, as object_md5s) and stops
        answering ("stop": SIGSTOP, resume() answers it) or dies ("kill": SIGKILL)."""
        status, content = self._request(
            "POST", f"{FAULTS}/arm?after={requests}&kind={kind}&record={record}")
        if status != 200:
            raise RuntimeError(f"arming a fault: HTTP {status} {content[:300]!r}")


# ------------------------------------------------------------------------------------------------
# The child process.


def _honour_preconditions() -> None:
    """Wraps the emulator's object handlers so ifGenerationMatch / ifGenerationNotMatch work."""
    from http import HTTPStatus

    from gcp_storage_emulator import server as srv
    from gcp_storage_emulator.exceptions import NotFound

    def object_name(request, storage):
        q = request.query
        if request.params and request.params.get("object_id"):
            return request.params["bucket_name"], request.params["object_id"]
        if "upload_id" in q:  # a resumable upload's chunk: its object was named when it began
            try:
                obj = storage.get_resumable_file_obj(q["upload_id"][0])
            except NotFound:
                return None, None
            return obj["bucket"], obj["name"]
        if "name" in q:
            return request.params["bucket_name"], q["name"][0]
        data = request.data
        if isinstance(data, dict):
            meta = data.get("meta") if "meta" in data else data
            if isinstance(meta, dict) and meta.get("name"):
                return request.params["bucket_name"], meta["name"]
        return None, None

    def guarded(handler):
        def wrapper(request, response, storage, *args, **kwargs):
            q = request.query
            match = q.get("ifGenerationMatch", [None])[0]
            not_match = q.get("ifGenerationNotMatch", [None])[0]
            if match is not None or not_match is not None:
                bucket, name = object_name(request, storage)
                if name is not None:
                    try:
                        current = int(storage.get_file_obj(bucket, name)["generation"])
                    except NotFound:
                        current = 0
                    if (match is not None and int(match) != current) or (
                            not_match is not None and int(not_match) == current):
                        response.status = HTTPStatus.PRECONDITION_FAILED
                        response.json({"error": {
                            "code": 412, "message": "At least one of the pre-conditions you "
                            "specified did not hold.",
                            "errors": [{"reason": "conditionNotMet", "domain": "global",
                                        "message": "Precondition Failed"}]}})
                        return None
            return handler(request, response, storage, *args, **kwargs)
        return wrapper

    guarded_methods = {"POST", "PUT", "DELETE", "PATCH"}
    srv.HANDLERS = tuple(
        (regex, {m: (guarded(h) if m in guarded_methods else h) for m, h in handlers.items()})
        for regex, handlers in srv.HANDLERS)
    original_insert = srv.objects.insert
    srv.objects.insert = guarded(original_insert)  # the Router's fallback for POST .../b/x/o


def _send_generations() -> None:
    """An object's download answers with its generation in `x-goog-generation` (and its
    metageneration), as Cloud Storage does. Without it tensorstore took a read's generation as 0
    and refused its next write conditioned on it ("Malformed StorageGeneration"): an OCDBT
    checkpoint that happened to re-read its manifest before updating it failed to save."""
    from http import HTTPStatus

    from gcp_storage_emulator import server as srv
    from gcp_storage_emulator.handlers import objects

    plain_download = objects.download

    def download(request, response, storage, *args, **kwargs):
        result = plain_download(request, response, storage, *args, **kwargs)
        # Answered: the object is there (the server takes one request at a time).
        if response.status in (HTTPStatus.OK, HTTPStatus.PARTIAL_CONTENT):
            obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
            response["x-goog-generation"] = str(obj["generation"])
            response["x-goog-metageneration"] = str(obj["metageneration"])
        return result

    objects.download = download  # what objects.get calls for ?alt=media
    srv.HANDLERS = tuple(
        (regex, {m: (download if h is plain_download else h) for m, h in handlers.items()})
        for regex, handlers in srv.HANDLERS)


def _inject_faults() -> None:
    """Counts the storage requests and, once armed (GcsEmulator.fault_after), stops or dies
    before answering a chosen one: a fault at an exactly known point of a client's work."""
    import threading
    import urllib.parse

    from gcp_storage_emulator import server as srv

    state = {"count": 0, "fault_at": None, "kind": "", "record": "", "changes": []}
    lock = threading.Lock()
    sender = threading.local()  # the Host header of the request this thread answers
    _record_changes(state["changes"], sender)

    def md5s(storage) -> dict:
        return {f"{bucket}/{name}": obj.get("md5Hash", "")
                for bucket, objects in storage.objects.items() for name, obj in objects.items()}

    def control(handler) -> None:
        url = urllib.parse.urlparse(handler.path)
        query = {k: v[0] for k, v in urllib.parse.parse_qs(url.query).items()}
        if url.path == f"{FAULTS}/arm":
            with lock:
                state.update(fault_at=state["count"] + int(query["after"]) + 1,
                             kind=query["kind"], record=query["record"])
            answer = {"armed": state["fault_at"]}
        elif url.path == f"{FAULTS}/md5s":
            answer = md5s(handler.storage)
        elif url.path == f"{FAULTS}/changes":
            answer = state["changes"]
        else:
            answer = {"requests": state["count"]}
        _answer_json(handler, answer)

    def fault(handler) -> None:
        with open(state["record"] + ".tmp", "w") as f:
            json.dump({"time": time.time(), "request": f"{handler.command} {handler.path}",
                       "md5s": md5s(handler.storage)}, f)
        os.rename(state["record"] + ".tmp", state["record"])
        state["fault_at"] = None  # a stopped server, resumed, answers as before
        os.kill(os.getpid(), signal.SIGSTOP if state["kind"] == "stop" else signal.SIGKILL)

    def counted(method):
        def handle(handler):
            if handler.path.startswith(FAULTS + "/"):
                return control(handler)
            with lock:
                state["count"] += 1
                due = state["fault_at"] is not None and state["count"] >= state["fault_at"]
            if due:
                fault(handler)
            sender.host = handler.headers.get("Host", "")
            return method(handler)
        return handle

    for name in ("do_GET", "do_POST", "do_PUT", "do_DELETE", "do_PATCH"):
        setattr(srv.RequestHandler, name, counted(getattr(srv.RequestHandler, name)))


def _answer_json(handler, answer) -> None:
    """A 200 response with `answer` as its JSON body (the test-only endpoints' answers)."""
    body = json.dumps(answer).encode()
    handler.send_response(200)
    handler.send_header("Content-Type", "application/json")
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)


def _count_body_bytes() -> None:
    """Counts the bytes of the response bodies the server writes; GET BODY_BYTES answers
    {"bytes": total} (its own answer not counted)."""
    from gcp_storage_emulator import server as srv

    sent = {"bytes": 0}
    plain_close = srv.Response.close

    def close(response):
        content = response._content
        sent["bytes"] += len(content.encode() if isinstance(content, str) else content)
        return plain_close(response)

    srv.Response.close = close
    plain_get = srv.RequestHandler.do_GET

    def do_get(handler):
        if handler.path != BODY_BYTES:
            return plain_get(handler)
        _answer_json(handler, sent)

    srv.RequestHandler.do_GET = do_get

def _record_changes(changes: list, sender) -> None:
    """Appends [host, "create" or "delete", "bucket/name"] to `changes` for every object the
    server writes (any upload, copy, rewrite or compose) or deletes."""
    from gcp_storage_emulator.storage import Storage

    create, delete = Storage.create_file, Storage.delete_file

    def create_file(storage, bucket_name, file_name, *args, **kwargs):
        changes.append([getattr(sender, "host", ""), "create", f"{bucket_name}/{file_name}"])
        return create(storage, bucket_name, file_name, *args, **kwargs)

    def delete_file(storage, bucket_name, file_name, *args, **kwargs):
        changes.append([getattr(sender, "host", ""), "delete", f"{bucket_name}/{file_name}"])
        return delete(storage, bucket_name, file_name, *args, **kwargs)

    Storage.create_file, Storage.delete_file = create_file, delete_file


def _refuse_operations(operations: list[str]) -> None:
    """Object routes ending `/<operation>/b/...` (rewriteTo, copyTo, moveTo) answer 501 Not
    Implemented, in a batch too: a server that lacks them. (The stock emulator has no moveTo
    route at all, which is answered 501 already.)"""
    from http import HTTPStatus

    from gcp_storage_emulator import server as srv
    from gcp_storage_emulator.handlers import objects

    def refused(request, response, storage, *args, **kwargs):
        response.status = HTTPStatus.NOT_IMPLEMENTED
        response.json({"error": {"code": 501, "message": "not implemented by this server"}})

    marks = tuple(f"/{operation}/" for operation in operations)
    srv.HANDLERS = tuple(
        (regex, {m: refused for m in handlers} if any(mark in regex for mark in marks)
         else handlers) for regex, handlers in srv.HANDLERS)
    plain_batch = objects.batch

    def batch(request, response, storage, *args, **kwargs):
        # A batch's items are parsed already: a copy is the one with a destination.
        if "copyTo" in operations and any("dest_bucket_name" in item for item in request.data):
            return refused(request, response, storage)
        return plain_batch(request, response, storage, *args, **kwargs)

    srv.HANDLERS = tuple(
        (regex, {m: (batch if h is plain_batch else h) for m, h in handlers.items()})
        for regex, handlers in srv.HANDLERS)


def _serve(preconditions: bool, refuse: list[str]) -> None:
    import logging

    logging.basicConfig(level=logging.CRITICAL)
    _inject_faults()
    _count_body_bytes()
    _send_generations()
    if preconditions:
        _honour_preconditions()
    if refuse:
        _refuse_operations(refuse)
    import http.server

    from gcp_storage_emulator.server import create_server
    from gcp_storage_emulator.storage import Storage

    # After every change the emulator writes all its metadata (every bucket's and object's) as
    # indented JSON to a `.meta` file that only its start reads: a server in memory, started
    # afresh, never does. That write grows with the objects held, and was most of the
    # emulator's CPU.
    Storage._write_config_to_file = lambda storage: None
    # The server answers one request at a time, and clients (tensorstore writing a checkpoint)
    # open dozens of connections at once: with socketserver's listen backlog of 5, the kernel
    # dropped the rest and each waited out a 1 s SYN retransmission.
    http.server.HTTPServer.request_queue_size = 1024
    server = create_server(HOST, 0, in_memory=True)
    server.start()
    parent = os.getppid()
    print(f"PORT {server._api._httpd.server_address[1]}", flush=True)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    try:
        while os.getppid() == parent:  # a parent killed outright (SIGKILL) leaves no orphan
            time.sleep(0.5)
    finally:
        server.stop()


if __name__ == "__main__" and "--serve" in sys.argv:
    _serve("--preconditions" in sys.argv,
           [op for a in sys.argv if a.startswith("--refuse=") for op in a[9:].split(",")])
