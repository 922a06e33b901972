"""The start-up deadline: TensorFlow waits for missing peers in C++ without a limit, holding Python's interpreter
lock, so only another process can end that wait. train.devices.runtime makes the multi-worker strategy inside it.
No TensorFlow here.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import Protocol


class WorkerPlace(Protocol):
    """This worker's place among TF_CONFIG's workers: what the devices read of train.settings.tf_config.Cluster."""

    @property
    def addresses(self) -> tuple[str, ...]: ...

    @property
    def num_workers(self) -> int: ...

    @property
    def worker_index(self) -> int: ...

    @property
    def address(self) -> str: ...

    def describe(self) -> dict[str, object]: ...


# The start-up deadline: a watchdog process, because TensorFlow's wait for peers holds the GIL. Every
# `every` seconds it says who is up (something listens at the address) and who is awaited.
_WATCHDOG = r"""
import os, select, signal, socket, sys, time
parent, seconds, every, message, index, addresses = sys.argv[1], float(sys.argv[2]), float(sys.argv[3]), \
    sys.argv[4], int(sys.argv[5]), sys.argv[6:]
start = time.monotonic()

def listening(address):
    host, _, port = address.rpartition(":")
    try:
        socket.create_connection((host.strip("[]"), int(port)), timeout=1).close()
        return True
    except OSError:
        return False

while True:
    left = seconds - (time.monotonic() - start)
    ready, _, _ = select.select([sys.stdin], [], [], max(0.0, min(every, left)))
    if ready:  # the parent wrote "ok" or exited: either way, nothing to do
        sys.exit(0)
    if time.monotonic() - start >= seconds:
        break
    up, awaited = [f"worker {index} (this one, {addresses[index]})"], []
    for i, address in enumerate(addresses):
        if i != index and listening(address):
            up.append(f"worker {i} ({address})")
        elif i != index:
            awaited.append(f"worker {i} at {address}")
    waiting = (f"awaited: {', '.join(awaited)} (nothing listens there)" if awaited else
               "every address answers: waiting for the workers to register (the same TF_CONFIG cluster on each?)")
    sys.stdout.write(f"Waiting for the workers of TF_CONFIG ({time.monotonic() - start:.0f} s of "
                     f"WORKER_START_TIMEOUT={seconds:g}): up: {', '.join(up)}; {waiting}\n")
    sys.stdout.flush()
silent = [a for i, a in enumerate(addresses) if i != index and not listening(a)]
missing = ("; nothing listens at " + ", ".join(silent)) if silent else ""
sys.stderr.write("error: " + message + missing + "\n")
sys.stderr.flush()
os.kill(int(parent), signal.SIGKILL)
"""
WAITING_REPORT_SECONDS = 30  # how often a worker waiting for the others says who it waits for


class StartupDeadline:
    """Within `seconds`, the block must finish, or this process is killed with a one-line error (exit 137).

    A small child process watches a pipe; leaving the block (or this process dying) closes it. Meanwhile it
    prints, every `report_every` seconds, which workers are up and which are awaited, at which address.
    """

    def __init__(self, cluster: WorkerPlace, seconds: float, report_every: float = WAITING_REPORT_SECONDS) -> None:
        self.cluster = cluster
        self.seconds = seconds
        self.report_every = report_every
        self._child: subprocess.Popen | None = None

    def __enter__(self) -> StartupDeadline:
        message = (
            f"WORKER_START_TIMEOUT={self.seconds:g}: worker {self.cluster.worker_index} ({self.cluster.address}) "
            f"waited {self.seconds:g} s and the {self.cluster.num_workers} workers of TF_CONFIG did not all join. "
            "Start every worker with the same TF_CONFIG cluster and its own task index, check that the "
            "addresses are reachable, or raise WORKER_START_TIMEOUT"
        )
        arguments = [str(os.getpid()), str(self.seconds), str(self.report_every), message]
        self._child = subprocess.Popen(
            [sys.executable, "-c", _WATCHDOG, *arguments, str(self.cluster.worker_index), *self.cluster.addresses],
            stdin=subprocess.PIPE,
        )
        return self

    def __exit__(self, *exc: object) -> None:
        assert self._child is not None and self._child.stdin is not None
        try:
            self._child.stdin.write(b"ok\n")
            self._child.stdin.close()
        except BrokenPipeError:
            pass
        self._child.wait()
