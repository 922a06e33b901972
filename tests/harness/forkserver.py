"""Fast starts for the tests' TensorFlow processes.

Importing TensorFlow, Keras and TFDS is a large part of a short test run, and the suite starts a few hundred
(docs/design.md, How the tests run). This server imports them once (without running a TensorFlow op, so no
device is set up yet) and forks each run from itself. A forked run is a real process, with its own pid,
arguments, environment, working directory, standard streams, signals and exit code. What differs from a fresh
`python -m train`: only that the modules' import-time code ran once, in the server, with the server's
environment. Tests of what happens at import (the C++ start-up lines, what validation imports, --help's time)
start a real interpreter instead (conftest's `fresh=True`).

Protocol, over a SOCK_SEQPACKET Unix socket: the client sends one JSON request {"argv", "env", "cwd"} with its
stdin, stdout and stderr as file descriptors; the server answers the child's pid, then, when the child ends, its
return code as subprocess gives it (negative: killed by that signal).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import runpy
import selectors
import signal
import socket
import sys
import tempfile

SERVER_PYTHONPATH = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
# What every run imports: the libraries, the engine, and what a run loads lazily (the CLI and typer's parsing, which
# brings pydantic; TensorBoard's summaries, about a hundred modules; the export's). Each module here is imported once
# rather than in each of the suite's forked runs: about 0.7 s of CPU off each small fit (219 modules a run before).
PRELOAD = (
    "tensorflow", "keras", "tensorflow_datasets", "train.fit", "train.tools.check", "train.tools.bench",
    "train.cli", "train.plugins", "typer._coercion", "typer._adapters", "typer._param_types", "tensorboard.summary",
    "tensorflow.saved_model.experimental", "tree",
)  # fmt: skip


def serve(path: str) -> dict:
    """Serve forever; returns only in a forked child, with the request that child must run."""
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "1")  # as train/__main__.py sets it before TensorFlow loads
    for name in PRELOAD:
        __import__(name)
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
    listener.bind(path)
    listener.listen(64)
    woken, wake = socket.socketpair()
    woken.setblocking(False)
    wake.setblocking(False)
    signal.set_wakeup_fd(wake.fileno())
    signal.signal(signal.SIGCHLD, lambda *_: None)  # a handler, so that SIGCHLD writes to the wake-up socket
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    selector.register(woken, selectors.EVENT_READ)
    print("ready", flush=True)
    children: dict[int, socket.socket] = {}
    while True:
        for key, _ in selector.select():
            if key.fileobj is woken:
                while True:
                    try:
                        woken.recv(4096)
                    except BlockingIOError:
                        break
                continue
            connection, _ = listener.accept()
            message, fds, _, _ = socket.recv_fds(connection, 1 << 20, 3)
            sys.stdout.flush()
            sys.stderr.flush()
            pid = os.fork()
            if pid == 0:
                for open_socket in (listener, woken, wake, connection, *children.values()):
                    open_socket.close()
                selector.close()
                signal.set_wakeup_fd(-1)
                signal.signal(signal.SIGCHLD, signal.SIG_DFL)
                for target, fd in enumerate(fds):
                    os.dup2(fd, target)
                    os.close(fd)
                return json.loads(message)
            for fd in fds:
                os.close(fd)
            connection.sendall(f"{pid}".encode())
            children[pid] = connection
        _reap(children)


def _reap(children: dict[int, socket.socket]) -> None:
    while children:
        try:
            pid, status = os.waitpid(-1, os.WNOHANG)
        except ChildProcessError:
            return
        if pid == 0:
            return
        connection = children.pop(pid, None)
        if connection is not None:
            with contextlib.suppress(OSError):  # the test that started it may be gone
                connection.sendall(f"{os.waitstatus_to_exitcode(status)}".encode())
            connection.close()


def run(request: dict) -> None:
    """Become `python ARGV` in the request's directory and environment."""
    os.chdir(request["cwd"])
    os.environ.clear()
    os.environ.update(request["env"])
    unbuffered = bool(os.environ.get("PYTHONUNBUFFERED"))
    sys.stdout.reconfigure(line_buffering=unbuffered or os.isatty(1), write_through=unbuffered)
    random.seed()  # a fresh interpreter's seed, not the server's copy
    tempfile.tempdir = None  # found again from this TMPDIR, not the server's
    option, target, *rest = request["argv"]
    # sys.path as a fresh interpreter makes it: the script's place first, then the request's PYTHONPATH
    pythonpath = [entry for entry in os.environ.get("PYTHONPATH", "").split(os.pathsep) if entry]
    sys.path[: 1 + len(SERVER_PYTHONPATH)] = [os.getcwd() if option == "-m" else "", *pythonpath]
    if option == "-m":
        sys.argv = [target, *rest]
        runpy.run_module(target, run_name="__main__", alter_sys=True)
    elif option == "-c":
        sys.argv = ["-c", *rest]
        exec(compile(target, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    else:
        raise SystemExit(f"forkserver: runs `-m MODULE ...` or `-c CODE ...`, not {request['argv']!r}")


if __name__ == "__main__":
    run(serve(sys.argv[1]))
