"""TF_CONFIG: the workers of a multi-worker run, read and checked before TensorFlow starts.

TensorFlow reads TF_CONFIG itself and meets a malformed one with a stack trace, or with a wait
that never ends; here each mistake is one line naming TF_CONFIG, the bad value and what is allowed.
Also the start-up deadline: TensorFlow waits for missing peers in C++ without a limit, holding
Python's interpreter lock, so only another process can end that wait.

    TF_CONFIG='{"cluster": {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]}, "task": {"type": "worker", "index": 0}}'

Worker 0 is the chief (or the one `chief` task, when the cluster has one): it writes the run
directory; every worker trains. No TensorFlow here.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from train.errors import SettingsError

EXAMPLE = '{"cluster": {"worker": ["host1:2222", "host2:2222"]}, "task": {"type": "worker", "index": 0}}'
TASK_TYPES = ("worker", "chief")
_ADDRESS = re.compile(r"(?P<host>\[[0-9A-Fa-f:.]+\]|[A-Za-z0-9_.\-]+):(?P<port>[0-9]{1,5})")


@dataclass(frozen=True)
class Cluster:
    """This worker's place in the cluster that TF_CONFIG describes."""

    chief: tuple[str, ...]  # zero or one address
    worker: tuple[str, ...]
    task_type: str  # "chief" or "worker"
    task_index: int

    @property
    def addresses(self) -> tuple[str, ...]:
        """Every worker, in TensorFlow's order: the chief task (if any) first, then the workers."""
        return self.chief + self.worker

    @property
    def num_workers(self) -> int:
        return len(self.addresses)

    @property
    def worker_index(self) -> int:
        """0 .. num_workers-1, in the order of `addresses` (TensorFlow's `id_in_cluster`)."""
        return self.task_index if self.task_type == "chief" else len(self.chief) + self.task_index

    @property
    def is_chief(self) -> bool:
        return self.worker_index == 0

    @property
    def address(self) -> str:
        return self.addresses[self.worker_index]

    def own_file(self, name: str) -> str:
        """This worker's file of a kind every worker may write into OUTPUT_DIR (crash.log): the chief's is `name`,
        worker 1's `name` with -worker1 before its suffix."""
        if self.is_chief:
            return name
        path = Path(name)
        return f"{path.stem}-worker{self.worker_index}{path.suffix}"

    def describe(self) -> dict[str, object]:
        return {
            "task": f"{self.task_type}:{self.task_index}",
            "worker_index": self.worker_index,
            "is_chief": self.is_chief,
            "address": self.address,
            "workers": list(self.addresses),
        }


def _fail(text: str, problem: str, allowed: str) -> SettingsError:
    shown = text if len(text) <= 200 else text[:197] + "..."
    return SettingsError(f"TF_CONFIG={shown!r} {problem}: {allowed}")


def parse_tf_config(text: str | None) -> Cluster | None:
    """The cluster TF_CONFIG names, or None when it is unset or empty. Raises SettingsError."""
    if text is None or text.strip() == "":
        return None
    try:
        config = json.loads(text)
    except json.JSONDecodeError as error:
        problem = f"is not valid JSON ({error.msg} at character {error.pos})"
        raise _fail(text, problem, f"use JSON like {EXAMPLE}") from None
    if not isinstance(config, dict):
        raise _fail(text, "is not a JSON object", f"use JSON like {EXAMPLE}")

    cluster = config.get("cluster")
    if not isinstance(cluster, dict) or not cluster:
        raise _fail(text, 'has no "cluster" object', f'name every worker\'s host:port under "cluster", like {EXAMPLE}')
    for job in cluster:
        if job not in TASK_TYPES:
            hint = {
                "ps": "parameter servers are ParameterServerStrategy's, which this template does not use",
                "evaluator": "evaluation runs on the chief here",
            }.get(job, "unknown job")
            raise _fail(text, f"has a {job!r} job ({hint})", "use only worker and, optionally, one chief")
    jobs: dict[str, tuple[str, ...]] = {}
    for job in TASK_TYPES:
        addresses = cluster.get(job, [])
        if not isinstance(addresses, list) or not all(isinstance(a, str) for a in addresses):
            raise _fail(text, f'has a "{job}" that is not a list of "host:port" strings', f"use JSON like {EXAMPLE}")
        for address in addresses:
            match = _ADDRESS.fullmatch(address)
            if not match or not 1 <= int(match.group("port")) <= 65535:
                raise _fail(text, f"has the address {address!r}", "use host:port with a port from 1 to 65535")
        jobs[job] = tuple(addresses)
    if len(jobs["chief"]) > 1:
        raise _fail(text, f"names {len(jobs['chief'])} chiefs", "use at most one chief (or none: worker 0 leads)")
    if not jobs["worker"] and not jobs["chief"]:
        raise _fail(text, "names no worker", f"list every worker's host:port, like {EXAMPLE}")
    everyone = jobs["chief"] + jobs["worker"]
    duplicates = sorted({a for a in everyone if everyone.count(a) > 1})
    if duplicates:
        raise _fail(text, f"names {', '.join(duplicates)} twice", "give every worker its own host:port")

    task = config.get("task")
    if not isinstance(task, dict):
        raise _fail(
            text, 'has no "task"', 'add this worker\'s "task": {"type": "worker", "index": N}, N its place in the list'
        )
    task_type = task.get("type")
    if task_type not in TASK_TYPES or not jobs[task_type]:
        present = [job for job in TASK_TYPES if jobs[job]]
        raise _fail(text, f"has task type {task_type!r}", f"use one of the cluster's jobs: {', '.join(present)}")
    index = task.get("index", None)
    count = len(jobs[task_type])
    if isinstance(index, bool) or not isinstance(index, int) or not 0 <= index < count:
        raise _fail(
            text, f"has task index {index!r}", f'use a whole number from 0 to {count - 1} (the "{task_type}" list)'
        )
    return Cluster(chief=jobs["chief"], worker=jobs["worker"], task_type=task_type, task_index=index)


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

    def __init__(self, cluster: Cluster, seconds: float, report_every: float = WAITING_REPORT_SECONDS) -> None:
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
