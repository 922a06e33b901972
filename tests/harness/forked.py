"""The client of tests/harness/forkserver.py: `Forked` starts a process there and is used as subprocess.Popen is
(pid, stdout/stderr, poll, wait, communicate, send_signal, kill, returncode)."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


class Server:
    """One fork server per test process (pytest-xdist worker), started on first use."""

    def __init__(self, env: dict[str, str]) -> None:
        self._folder = tempfile.mkdtemp(prefix="forkserver-")
        self.path = os.path.join(self._folder, "socket")
        self.process = subprocess.Popen(
            [sys.executable, "-m", "tests.harness.forkserver", self.path],
            cwd=REPO, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True,
        )  # fmt: skip
        if self.process.stdout.readline().strip() != "ready":
            raise RuntimeError(f"the fork server did not start (exit {self.process.wait()})")

    def close(self) -> None:
        self.process.kill()
        self.process.wait()
        for name in os.listdir(self._folder):
            os.unlink(os.path.join(self._folder, name))
        os.rmdir(self._folder)


class Forked:
    """`python ARGV` forked from the server. stdin/stdout/stderr: None (this process's), subprocess.PIPE,
    subprocess.DEVNULL, subprocess.STDOUT (stderr only), a file descriptor or an open file, as for
    subprocess.Popen."""

    def __init__(self, server: Server, argv: list[str], *, cwd: Path, env: dict[str, str], stdin=None,
                 stdout=None, stderr=None, text: bool = False) -> None:  # fmt: skip
        self.args = [sys.executable, *argv]
        self.returncode: int | None = None
        self.stdin = self.stdout = self.stderr = None
        self._readers: list[threading.Thread] | None = None
        self._read: dict[str, str | bytes] = {}
        ends, theirs, opened = {}, [], []
        for number, choice in enumerate((stdin, stdout, stderr)):
            if choice == subprocess.PIPE:
                read, write = os.pipe()
                ends[number], child_end = (write, read) if number == 0 else (read, write)
                theirs.append(child_end)
                opened.append(child_end)
            elif choice == subprocess.DEVNULL:
                theirs.append(os.open(os.devnull, os.O_RDWR))
                opened.append(theirs[-1])
            elif choice == subprocess.STDOUT and number == 2:
                theirs.append(theirs[1])
            elif choice is None:
                theirs.append(number)
            elif isinstance(choice, int) and choice >= 0:  # a file descriptor of the caller's, e.g. a terminal's
                theirs.append(choice)
            elif hasattr(choice, "fileno"):  # an open file
                theirs.append(choice.fileno())
            else:
                raise ValueError(f"Forked takes None, PIPE, DEVNULL, STDOUT, a descriptor or a file, not {choice!r}")
        self._connection = socket.socket(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._connection.connect(server.path)
        request = {"argv": list(argv), "env": env, "cwd": str(cwd)}
        socket.send_fds(self._connection, [json.dumps(request).encode()], theirs)
        for fd in opened:
            os.close(fd)
        self.pid = int(self._connection.recv(64))
        mode = "" if text else "b"
        if 0 in ends:
            self.stdin = os.fdopen(ends[0], "w" + mode)
        if 1 in ends:
            self.stdout = os.fdopen(ends[1], "r" + mode)
        if 2 in ends:
            self.stderr = os.fdopen(ends[2], "r" + mode)

    def poll(self) -> int | None:
        return self.wait(timeout=0) if self.returncode is None else self.returncode

    def wait(self, timeout: float | None = None) -> int | None:
        if self.returncode is None:
            self._connection.settimeout(timeout)
            try:
                answer = self._connection.recv(64)
            except (TimeoutError, BlockingIOError):
                if timeout == 0:
                    return None
                raise subprocess.TimeoutExpired(self.args, timeout) from None
            self.returncode = int(answer)
            self._connection.close()
        return self.returncode

    def communicate(self, input=None, timeout: float | None = None) -> tuple:
        deadline = None if timeout is None else time.monotonic() + timeout
        if self._readers is None:  # a second call (after a timeout) goes on with the first call's readers
            if self.stdin is not None:
                if input:
                    self.stdin.write(input)
                self.stdin.close()
            self._readers = [
                threading.Thread(target=lambda name=name, stream=stream: self._read.__setitem__(name, stream.read()),
                                 daemon=True)
                for name, stream in (("stdout", self.stdout), ("stderr", self.stderr)) if stream is not None
            ]  # fmt: skip
            for reader in self._readers:
                reader.start()
        for reader in self._readers:
            reader.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
            if reader.is_alive():
                raise subprocess.TimeoutExpired(self.args, timeout)
        self.wait(None if deadline is None else max(0.0, deadline - time.monotonic()))
        for stream in (self.stdout, self.stderr):
            if stream is not None:
                stream.close()
        return self._read.get("stdout"), self._read.get("stderr")

    def send_signal(self, number: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, number)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)
