"""The server behind tests/preloaded_python.py: an interpreter that has imported JAX, Flax, Optax,
Orbax and every bertjax module once, and forks a process for each `python -m bertjax.X` or
`python -c CODE` it is asked to start.

Run as `python preloaded_server.py SOCKET` (SOCKET's directory is the server's: it removes it when
it exits); its stdin is a pipe from the process that started it,
which it never reads: end of file there means that process is gone, and the server exits. Each
request is one connection (a SOCK_SEQPACKET socket): the request's JSON (argv after the
interpreter, env, cwd) with the child's stdin, stdout and stderr as passed descriptors. The server
answers the child's pid, and, once it has reaped the child, its wait status.

The server imports nothing but these (and two modules bertjax defers, preload_deferred) and
starts no backend (no XLA client, no devices): a child creates its own, reading its XLA_FLAGS
then, as a fresh interpreter does. It never runs threads of its own; OpenBLAS's (started by
numpy) re-creates its pool in a forked child.
"""

import atexit
import gc
import importlib
import io
import json
import os
import pkgutil
import re
import runpy
import selectors
import shutil
import signal
import socket
import sys
import threading
import types

MAX_REQUEST = 1 << 20
# `python -m bertjax.main` and the other documented names are shims that run their command module
# as the program (runpy): neither may be imported when it runs, or runpy warns that it was.
SHIM = re.compile(r'runpy\.run_module\("([\w.]+)"')


def preload() -> tuple:
    """Imports what the children import. Returns the variables those imports set in os.environ
    (a child must see them, as it would have set them itself), and each shim's command module."""
    before = dict(os.environ)
    import bertjax
    programs = {}
    for module in pkgutil.walk_packages(bertjax.__path__, "bertjax."):
        # A package's __main__ (`python -m bertjax.bench`) is read, not run.
        program = module.name.removesuffix(".__main__")
        if program == module.name:
            importlib.import_module(module.name)
        spec = module.module_finder.find_spec(module.name.rpartition(".")[2])
        with open(spec.origin, encoding="utf-8") as source:
            target = SHIM.search(source.read())
        if target:
            programs[program] = target.group(1)
    preload_deferred()
    gc.collect()
    gc.freeze()  # what the imports made is never freed: no child's collector need scan it
    return {k: v for k, v in os.environ.items() if before.get(k) != v}, programs


def preload_deferred() -> None:
    """What a child would otherwise import after the fork, each time. py-spy over a fresh suite
    found 48 s of the children's CPU in such imports: 16 s tensorboardX (every training run
    imports it, torch hidden) and 2.5 s the MLIR dialect JAX loads at its first lowering, 0.42 s
    and 0.015 s a server here. The others (the bucket backend 6 s, scipy 5 s, pyplot 3 s) are
    imported by so few children that preloading them in every server (about 0.45 s each) would
    save little."""
    importlib.import_module("bertjax.train.metrics_log")._summary_writer_class()
    importlib.import_module("jaxlib.mlir.dialects.mhlo")


def standard_streams() -> None:
    """sys.stdin/stdout/stderr over descriptors 0-2 as CPython's start-up makes them."""
    encoding = sys.stdout.encoding
    sys.stdin = sys.__stdin__ = io.TextIOWrapper(
        io.BufferedReader(io.FileIO(0, "r", closefd=False)), encoding=encoding)
    sys.stdout = sys.__stdout__ = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(1, "w", closefd=False)), encoding=encoding,
        line_buffering=os.isatty(1))
    # Since Python 3.9 stderr is line buffered whether or not it is a terminal.
    sys.stderr = sys.__stderr__ = io.TextIOWrapper(
        io.BufferedWriter(io.FileIO(2, "w", closefd=False)), encoding=encoding,
        errors="backslashreplace", line_buffering=True)


def run_program(argv: list, programs: dict) -> int:
    """Runs `-m MODULE ARGS` or `-c CODE ARGS` as the interpreter's main would; its exit status."""
    try:
        if argv[0] == "-m":
            for name in (argv[1], programs.get(argv[1])):
                sys.modules.pop(name, None)
            sys.argv = [argv[1], *argv[2:]]
            sys.path[0] = os.getcwd()
            runpy._run_module_as_main(argv[1], alter_argv=True)
        else:
            sys.argv = ["-c", *argv[2:]]
            sys.path[0] = ""
            main = types.ModuleType("__main__")
            main.__dict__["__builtins__"] = __builtins__
            sys.modules["__main__"] = main
            exec(compile(argv[1], "<string>", "exec"), main.__dict__)
        return 0
    except SystemExit as stop:
        if stop.code is None or isinstance(stop.code, int):
            return stop.code or 0
        print(stop.code, file=sys.stderr)
        return 1
    except BaseException:
        kind, error, trace = sys.exc_info()
        error.__traceback__ = trace.tb_next  # as the interpreter shows it: this frame left out
        sys.excepthook(kind, error, trace.tb_next)
        return 1


def finish(status: int) -> None:
    """CPython's exit: non-daemon threads joined, atexit handlers run, streams flushed."""
    threading._shutdown()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(status & 0xFF)


def become_child(request: dict, fds: list, inherited: list, preloaded: tuple) -> None:
    set_by_imports, programs = preloaded
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    for fd in inherited:
        os.close(fd)
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
    for fd in set(fds):
        if fd > 2:
            os.close(fd)
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update({**set_by_imports, **request["env"]})
    sys.orig_argv = [sys.executable, *request["argv"]]
    standard_streams()
    finish(run_program(request["argv"], programs))


def serve(path: str) -> None:
    preloaded = preload()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    # The client waits for the path to appear: it appears only once connections are accepted.
    listener.bind(path + ".binding")
    listener.listen(16)
    os.rename(path + ".binding", path)
    wake_read, wake_write = os.pipe()
    os.set_blocking(wake_write, False)
    signal.set_wakeup_fd(wake_write)
    signal.signal(signal.SIGCHLD, lambda *_: None)
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ, "request")
    selector.register(0, selectors.EVENT_READ, "parent")
    selector.register(wake_read, selectors.EVENT_READ, "child")
    waiting = {}  # pid -> the connection that asked for it
    while True:
        for key, _ in selector.select():
            if key.data == "parent":  # the process that started it has ended (or closed the pipe)
                shutil.rmtree(os.path.dirname(path), ignore_errors=True)
                return
            if key.data == "child":
                os.read(wake_read, 4096)
                reap(waiting)
                continue
            connection, _ = listener.accept()
            data, fds, _, _ = socket.recv_fds(connection, MAX_REQUEST, 3)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                inherited = [listener.fileno(), wake_read, wake_write, 0, selector.fileno(),
                             *(c.fileno() for c in waiting.values())]
                become_child(json.loads(data), fds, [fd for fd in inherited if fd not in fds],
                             preloaded)
            for fd in fds:
                os.close(fd)
            connection.send(str(pid).encode())
            waiting[pid] = connection


def reap(waiting: dict) -> None:
    while waiting:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        connection = waiting.pop(pid, None)
        if connection is not None:
            try:
                connection.send(str(status).encode())
            except OSError:  # the asker has gone
                pass
            connection.close()


if __name__ == "__main__":
    serve(sys.argv[1])
