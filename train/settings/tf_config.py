"""TF_CONFIG: the workers of a multi-worker run, read and checked before TensorFlow starts.

TensorFlow reads TF_CONFIG itself and meets a malformed one with a stack trace, or with a wait
that never ends; here each mistake is one line naming TF_CONFIG, the bad value and what is allowed.
(The start-up deadline, for TensorFlow's wait for those workers, is train.devices.deadline's.)

    TF_CONFIG='{"cluster": {"worker": ["10.0.0.1:2222", "10.0.0.2:2222"]}, "task": {"type": "worker", "index": 0}}'

Worker 0 is the chief (or the one `chief` task, when the cluster has one): it writes the run
directory; every worker trains. No TensorFlow here.
"""

from __future__ import annotations

import json
import re
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
