"""`python -m bertjax.X ...` and `python -c CODE ...` for the tests, forked from an interpreter that
has already imported JAX and bertjax (tests/preloaded_server.py) instead of started afresh.

Why: the suite starts about 180 such processes, and each spent 1.5-2 s of CPU importing JAX,
Flax, Optax, Orbax and bertjax before doing anything (a 6-step pretraining child: 4.7-6.1 s of CPU
forked against 6.0-8.7 s started, on 2 cores). A forked child is still a process of its own: its
own pid (tests signal and kill it), exit status, stdin/stdout/stderr, working directory and
environment; it creates its own JAX backend, reading XLA_FLAGS then. What it does not exercise is
the interpreter's start-up: the tests that are about that (`python -m bertjax.main --help`, a
command's first imports, the huge-page re-execution, bad input refused before JAX is imported)
start real interpreters with subprocess.

Variables read while importing (JAX_* among them) must be the server's, so each distinct
environment, less the variables only read at run time (RUN_TIME_VARIABLES), has a server of its
own; a test whose environment is one of a kind gains nothing from one, so past MAX_SERVERS a plain
subprocess starts instead.
"""

import atexit
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SERVER = os.path.join(HERE, "preloaded_server.py")
# A forked script's sys.executable (run_script), with these variables set for it.
FORWARDER = os.path.join(HERE, "forwarding_python")
FORWARDING_VARIABLES = ("PRELOADED_FORWARDER", "PRELOADED_SOCKET", "PRELOADED_PYTHON")
# Run first by an interpreter given forwarding()'s environment: its sys.executable is then the
# forwarder.
FORWARDER_SETUP = "import os, sys; sys.executable = os.environ['PRELOADED_FORWARDER']"
# What makes a process one of a multi-process job (bertjax.parallel.distributed).
JOB_VARIABLES = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID",
                 "JAX_LOCAL_DEVICE_IDS")
# Read by a child after its imports, never while importing (XLA_FLAGS when the backend starts).
RUN_TIME_VARIABLES = ("XLA_FLAGS", "PYTEST_CURRENT_TEST", "KILL_AFTER_CHECKPOINT",
                      "STOP_PID_AFTER_CHECKPOINT", "SIGTERM_DURING_COMPILE",
                      "STORAGE_EMULATOR_HOST", "BERTJAX_CACHE", "BERTJAX_STORAGE_TIMEOUT",
                      *JOB_VARIABLES, "HOLD_AFTER_CHECKPOINT", "SIGTERM_AFTER_STEP",
                      "MARKER_DIR",  # test_multihost's hooks
                      # read by launch/colab_tpu.ipynb's cells and Jupyter (test_notebook)
                      "BERTJAX_NOTEBOOK_QUICK", "BERTJAX_NOTEBOOK_WORKDIR", "JUPYTER_PATH",
                      *FORWARDING_VARIABLES)
MAX_SERVERS = 3
START_SECONDS = 120

_servers = {}


class _Server:
    def __init__(self, env: dict):
        self.directory = tempfile.mkdtemp(prefix="preloaded-")
        self.path = os.path.join(self.directory, "socket")
        self.log = os.path.join(self.directory, "log")
        with open(self.log, "wb") as log:
            # stdin stays an unread pipe: its end of file tells the server this process is gone.
            self.process = subprocess.Popen([sys.executable, SERVER, self.path], env=env,
                                            stdin=subprocess.PIPE, stdout=log, stderr=log)
        deadline = time.monotonic() + START_SECONDS
        while not os.path.exists(self.path):
            if self.process.poll() is not None or time.monotonic() > deadline:
                with open(self.log, errors="replace") as log:
                    raise RuntimeError(f"the preloaded server did not start:\n{log.read()[-3000:]}")
            time.sleep(0.02)

    def start(self, argv: list, env: dict, cwd: str, fds: list) -> tuple:
        return _start(self.path, argv, env, cwd, fds)

    def close(self):
        self.process.stdin.close()
        self.process.wait(timeout=30)


def _start(path: str, argv: list, env: dict, cwd: str, fds: list) -> tuple:
    """(the connection, the child's pid) of a child the server at `path` forked."""
    connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    connection.connect(path)
    request = json.dumps({"argv": argv, "env": env, "cwd": cwd}).encode()
    socket.send_fds(connection, [request], fds)
    return connection, int(connection.recv(64))


def _server_for(env: dict):
    key = tuple(sorted((k, v) for k, v in env.items() if k not in RUN_TIME_VARIABLES))
    if key not in _servers:
        if len(_servers) >= MAX_SERVERS:
            return None
        _servers[key] = _Server(dict(key))
    return _servers[key]


@atexit.register
def _close_servers():
    for server in _servers.values():
        server.close()


def _child_end(stream, default_fd: int, owned: list, stdout_fd=None) -> tuple:
    """(the descriptor the child gets, the parent's reading end or None)."""
    if stream is None:
        return default_fd, None
    if stream == subprocess.PIPE:
        read, write = os.pipe()
        owned.append(write)
        return write, read
    if stream == subprocess.DEVNULL:
        fd = os.open(os.devnull, os.O_RDWR)
        owned.append(fd)
        return fd, None
    if stream == subprocess.STDOUT:
        return stdout_fd, None
    return (stream if isinstance(stream, int) else stream.fileno()), None


class PreloadedProcess:
    """The part of subprocess.Popen the tests use, for a child of a preloaded server."""

    def __init__(self, server, args, *, env=None, cwd=None, stdin=None, stdout=None, stderr=None,
                 text=False):
        owned = []
        if stdin == subprocess.PIPE:
            in_fd, in_write = os.pipe()
            owned.append(in_fd)
        else:
            (in_fd, _), in_write = _child_end(stdin, 0, owned), None
        out_fd, out_read = _child_end(stdout, 1, owned)
        err_fd, err_read = _child_end(stderr, 2, owned, stdout_fd=out_fd)
        try:
            self._connection, self.pid = server.start(
                list(args[1:]), dict(os.environ if env is None else env),
                os.path.abspath(cwd or os.getcwd()), [in_fd, out_fd, err_fd])
        finally:
            for fd in owned:
                os.close(fd)
        self.args, self.returncode = args, None
        mode = "" if text else "b"
        self.stdin = os.fdopen(in_write, "w" + mode) if in_write is not None else None
        self.stdout = open(out_read, "r" + mode) if out_read is not None else None
        self.stderr = open(err_read, "r" + mode) if err_read is not None else None

    def poll(self):
        if self.returncode is None:
            self._connection.setblocking(False)
            try:
                self._set_status(self._connection.recv(64))
            except BlockingIOError:
                pass
        return self.returncode

    def wait(self, timeout=None):
        if self.returncode is None:
            self._connection.setblocking(True)
            self._connection.settimeout(timeout)
            try:
                self._set_status(self._connection.recv(64))
            except socket.timeout:
                raise subprocess.TimeoutExpired(self.args, timeout) from None
        return self.returncode

    def _set_status(self, answer: bytes):
        self.returncode = os.waitstatus_to_exitcode(int(answer))
        self._connection.close()

    def send_signal(self, sig):
        if self.poll() is None:
            os.kill(self.pid, sig)

    def terminate(self):
        self.send_signal(15)

    def kill(self):
        self.send_signal(9)

    def communicate(self, input=None, timeout=None):
        """Reads stdout and stderr to their ends (one thread each, as subprocess does on Windows),
        then waits; on a timeout the reading goes on, and a later call picks it up."""
        deadline = None if timeout is None else time.monotonic() + timeout
        if not hasattr(self, "_readers"):
            if self.stdin is not None:
                if input:
                    self.stdin.write(input)
                self.stdin.close()
            self._output = {}
            self._readers = [threading.Thread(target=self._read_all, args=(name,), daemon=True)
                             for name in ("stdout", "stderr") if getattr(self, name) is not None]
            for reader in self._readers:
                reader.start()
        for reader in self._readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return self._output.get("stdout"), self._output.get("stderr")

    def _read_all(self, name):
        stream = getattr(self, name)
        self._output[name] = stream.read()
        stream.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        for stream in (self.stdin, self.stdout, self.stderr):
            if stream is not None and not stream.closed:
                stream.close()
        self.wait()


def _forkable(args) -> bool:
    return (len(args) >= 2 and args[0] == sys.executable
            and (args[1] == "-c" or (args[1] == "-m" and len(args) > 2
                                     and args[2].startswith("bertjax"))))


def popen(args, *, env=None, **kwargs):
    """subprocess.Popen(args, ...) for `[sys.executable, "-m", "bertjax...", ...]` or
    `[sys.executable, "-c", CODE, ...]`, forked from a preloaded server where there is one."""
    server = _server_for(dict(os.environ if env is None else env)) if _forkable(args) else None
    if server is None:
        return subprocess.Popen(args, env=env, **kwargs)
    return PreloadedProcess(server, args, env=env, **kwargs)


def run(args, *, env=None, cwd=None, capture_output=False, text=False, timeout=None, input=None,
        stdin=None, stdout=None, stderr=None, check=False):
    """subprocess.run, its child started by `popen`."""
    if capture_output:
        stdout = stderr = subprocess.PIPE
    if input is not None:
        stdin = subprocess.PIPE
    with popen(args, env=env, cwd=cwd, stdin=stdin, stdout=stdout, stderr=stderr,
               text=text) as process:
        try:
            out, err = process.communicate(input, timeout=timeout)
        except subprocess.TimeoutExpired:
            process.kill()
            process.communicate()
            raise
    done = subprocess.CompletedProcess(args, process.returncode, out, err)
    if check:
        done.check_returncode()
    return done


# `python PATH ARGS...` in a forked child: the script's directory first on sys.path, as the
# interpreter puts it, and sys.executable the forwarder.
_SCRIPT = ("import os, runpy, sys\n"
           f"{FORWARDER_SETUP}\n"
           "sys.argv = sys.argv[1:]\n"
           "sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))\n"
           "runpy.run_path(sys.argv[0], run_name='__main__')\n")


def run_script(path: str, *args, env=None, **kwargs) -> subprocess.CompletedProcess:
    """subprocess.run([sys.executable, path, *args], ...) for a script that starts commands of its
    own with `[sys.executable, "-m", "bertjax...", ...]` (the benchmarks): the script is forked,
    and so is each such command, from the same server (tests/forwarding_python is its
    sys.executable); anything else it starts that way runs the real interpreter. What differs from
    real processes: a command is the server's child, not the script's, so the CPU time the script
    reads of its children (RUSAGE_CHILDREN) leaves the command's out."""
    env = forwarding(dict(os.environ if env is None else env))
    if "PRELOADED_FORWARDER" not in env:
        return subprocess.run([sys.executable, path, *args], env=env, **kwargs)
    return run([sys.executable, "-c", _SCRIPT, path, *args], env=env, **kwargs)


def forwarding(env: dict) -> dict:
    """`env` plus what a process started with it needs to start its `python -m bertjax...`
    commands forked (the forwarder, as its sys.executable: `FORWARDER_SETUP`); `env` as it is
    where no server can be had."""
    server = _server_for(env)
    if server is None:
        return env
    return {**env, "PRELOADED_FORWARDER": FORWARDER, "PRELOADED_SOCKET": server.path,
            "PRELOADED_PYTHON": sys.executable}


def forward(args: list) -> None:
    """The forwarder (`forwarding_python ARGS`): `-m bertjax...` forked from the server at
    PRELOADED_SOCKET, its stdin, stdout and stderr this process's, its exit status (or signal)
    made this process's; anything else replaced by the real interpreter."""
    python = os.environ["PRELOADED_PYTHON"]
    if not (len(args) > 1 and args[0] == "-m" and args[1].startswith("bertjax")):
        os.execv(python, [python, *args])
    connection, pid = _start(os.environ["PRELOADED_SOCKET"], args, dict(os.environ),
                             os.getcwd(), [0, 1, 2])
    for number in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
        signal.signal(number, lambda received, frame: os.kill(pid, received))
    code = os.waitstatus_to_exitcode(int(connection.recv(64)))
    if code < 0:
        if -code in (signal.SIGTERM, signal.SIGINT, signal.SIGHUP):
            signal.signal(-code, signal.SIG_DFL)  # this process's handler forwards it
        os.kill(os.getpid(), -code)
    sys.exit(code)


if __name__ == "__main__":
    forward(sys.argv[1:])
