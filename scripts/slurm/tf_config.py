"""Print this Slurm task's TF_CONFIG, built from the Slurm environment (stdlib only; no TensorFlow).

    TF_CONFIG="$(python3 scripts/slurm/tf_config.py)"     # inside srun; scripts/slurm/task.sh does this

Task I of the step is worker I (task 0, the chief, writes OUTPUT_DIR). The step's nodes come from
`scontrol show hostnames` of its node list, and Slurm's default block layout puts the first
tasks-per-node tasks on the first node, and so on: the K-th task on a node listens on
WORKER_PORT + K (default 2222), so several tasks per node work too. A wrong or missing variable is one
line naming it and its value, exit 2.

Not TensorFlow's SlurmClusterResolver: it runs nvidia-smi when CUDA_VISIBLE_DEVICES is unset (a
FileNotFoundError where there is none), overwrites CUDA_VISIBLE_DEVICES, and fixes the first port at
8888. Here GPUS (which the training reads) and WORKER_PORT stay the user's.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

DEFAULT_PORT = 2222  # the port the Kubernetes manifests and README use


class SlurmError(ValueError):
    """One line naming the variable, its value and what is allowed."""


def _integer(environ: dict[str, str], name: str, low: int, high: int | None = None, default: int | None = None) -> int:
    raw = environ.get(name)
    if raw is None and default is not None:
        return default
    allowed = f"an integer from {low}" + (f" to {high}" if high is not None else " up")
    try:
        value = int(raw or "")
    except ValueError:
        raise SlurmError(f"{name}={raw!r} is not allowed: use {allowed}") from None
    if value < low or (high is not None and value > high):
        raise SlurmError(f"{name}={raw!r} is not allowed: use {allowed}")
    return value


def tasks_per_node(text: str, name: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """Slurm's compressed count, "2(x3),1" -> [2, 2, 2, 1]."""
    counts = []
    for part in text.split(","):
        match = re.fullmatch(r"(\d+)(?:\(x(\d+)\))?", part.strip())
        if not match or int(match.group(1)) < 1:
            raise SlurmError(f"{name}={text!r} is not allowed: use Slurm's form, like 2 or 2(x3),1")
        counts += [int(match.group(1))] * int(match.group(2) or 1)
    return counts


def hostnames(nodelist: str) -> list[str]:
    """The node list expanded by Slurm itself ("node[1-3]" -> node1, node2, node3)."""
    try:
        result = subprocess.run(
            ["scontrol", "show", "hostnames", nodelist], capture_output=True, text=True, timeout=60, check=False
        )
    except FileNotFoundError:
        raise SlurmError("scontrol is not on PATH: run this inside a Slurm job (srun)") from None
    names = result.stdout.split()
    if result.returncode != 0 or not names:
        why = (result.stderr.strip().splitlines() or ["no host names"])[-1]
        raise SlurmError(f"scontrol show hostnames {nodelist!r} failed: {why}")
    return names


def tf_config(hosts: list[str], counts: list[int], task: int, port: int) -> dict:
    """TF_CONFIG for task `task`: one worker per task, hosts in block order, ports port, port + 1, ... per host."""
    workers = [f"{host}:{port + local}" for host, count in zip(hosts, counts, strict=True) for local in range(count)]
    return {"cluster": {"worker": workers}, "task": {"type": "worker", "index": task}}


def from_environment(environ: dict[str, str]) -> dict:
    # Inside srun the step's variables describe the tasks that train; the job's are the fallback.
    ntasks = _integer(environ, "SLURM_NTASKS", 1)
    task = _integer(environ, "SLURM_PROCID", 0, ntasks - 1)
    nodelist_name = "SLURM_STEP_NODELIST" if "SLURM_STEP_NODELIST" in environ else "SLURM_JOB_NODELIST"
    counts_name = "SLURM_STEP_TASKS_PER_NODE" if "SLURM_STEP_TASKS_PER_NODE" in environ else "SLURM_TASKS_PER_NODE"
    if nodelist_name not in environ:
        raise SlurmError("SLURM_JOB_NODELIST is not set: run this inside a Slurm job (srun)")
    hosts = hostnames(environ[nodelist_name])
    counts = tasks_per_node(environ.get(counts_name, ""), counts_name)
    if len(counts) != len(hosts) or sum(counts) != ntasks:
        raise SlurmError(
            f"{counts_name}={environ.get(counts_name, '')!r} does not fit {ntasks} tasks on the {len(hosts)} node(s) "
            f"of {nodelist_name}={environ[nodelist_name]!r}: srun must run SLURM_NTASKS tasks on those nodes"
        )
    port = _integer(environ, "WORKER_PORT", 1, 65536 - max(counts), DEFAULT_PORT)
    config = tf_config(hosts, counts, task, port)
    host = config["cluster"]["worker"][task].rsplit(":", 1)[0]
    node = environ.get("SLURMD_NODENAME")
    if node and node != host:  # the addresses assume block order; anything else would pair ranks wrongly
        raise SlurmError(
            f"SLURM_PROCID={task} runs on {node}, but the block layout puts it on {host}: "
            "use srun's default --distribution=block"
        )
    return config


def main() -> int:
    try:
        print(json.dumps(from_environment(dict(os.environ))))
    except SlurmError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    sys.exit(main())
