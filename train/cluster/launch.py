"""Run N workers of a multi-worker job on this host, for trying it out and for the tests.

    python -m train.cluster.launch 2 -- fit --epochs 3       # or: scripts/launch-workers.sh 2 fit --epochs 3

Each worker is `python -m train ARGS` with STRATEGY=multi_worker and its own TF_CONFIG naming free
loopback ports (127.0.0.1 only). Their output is interleaved line by line, each line prefixed with
`[worker I]`. SIGTERM or Ctrl-C to the launcher is passed to every worker (they save and exit 42);
if one worker ends with an error, the others get GRACE seconds to notice (they do, in about a
second for a dead peer, ~10 s for a hung one) and are then killed. The launcher's exit code is the
first worker error's, else 42 if any worker stopped to be restarted, else 0.

Not for several hosts: there, start one worker per host with TF_CONFIG naming every host (docs/operations.md).
No TensorFlow here.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import IO

from train.errors import EXIT_PREEMPTED

GRACE = 30.0  # seconds the others get to end by themselves after one worker failed


def free_ports(count: int, host: str = "127.0.0.1") -> list[int]:
    """Ports the kernel says are free now (held open together, so they are distinct)."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind((host, 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def tf_configs(ports: list[int], host: str = "127.0.0.1") -> list[str]:
    """One TF_CONFIG per worker; worker 0 is the chief."""
    cluster = {"worker": [f"{host}:{port}" for port in ports]}
    return [json.dumps({"cluster": cluster, "task": {"type": "worker", "index": i}}) for i in range(len(ports))]


def _pump(stream: IO[bytes], prefix: bytes, out: IO[bytes], lock: threading.Lock) -> None:
    for line in iter(stream.readline, b""):
        with lock:
            out.write(prefix + line)
            out.flush()


def launch(count: int, args: list[str], env: dict[str, str] | None = None, grace: float = GRACE) -> int:
    env = dict(os.environ if env is None else env)
    env["STRATEGY"] = "multi_worker"
    configs = tf_configs(free_ports(count))
    lock = threading.Lock()
    out = sys.stdout.buffer
    workers = []
    pumps = []
    for index, config in enumerate(configs):
        process = subprocess.Popen(
            [sys.executable, "-m", "train", *args],
            env={**env, "TF_CONFIG": config},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            start_new_session=True,  # Ctrl-C in the terminal reaches the launcher only; it forwards it once
        )
        workers.append(process)
        pump = threading.Thread(target=_pump, args=(process.stdout, f"[worker {index}] ".encode(), out, lock))
        pump.start()
        pumps.append(pump)
    with lock:
        out.write(f"[launch] {count} workers, pids {' '.join(str(p.pid) for p in workers)}\n".encode())
        out.flush()

    def forward(signum: int, frame: object) -> None:
        for process in workers:
            if process.poll() is None:
                process.send_signal(signal.SIGTERM)  # the workers' own handlers save and exit 42

    previous = {s: signal.signal(s, forward) for s in (signal.SIGTERM, signal.SIGINT)}
    first_error: int | None = None
    deadline = None
    try:
        while any(p.poll() is None for p in workers):
            for process in workers:
                code = process.poll()
                if code not in (None, 0, EXIT_PREEMPTED) and first_error is None:
                    first_error = code
                    deadline = time.monotonic() + grace
            if deadline is not None and time.monotonic() > deadline:
                for process in workers:
                    if process.poll() is None:
                        process.kill()
            time.sleep(0.1)
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        for pump in pumps:
            pump.join()
    codes = [p.returncode for p in workers]
    with lock:
        out.write(f"[launch] exit codes {codes}\n".encode())
        out.flush()
    failures = [c for c in codes if c not in (0, EXIT_PREEMPTED)]
    if first_error is not None:
        return first_error if first_error > 0 else 128 - first_error
    if failures:
        return failures[0] if failures[0] > 0 else 128 - failures[0]
    return EXIT_PREEMPTED if EXIT_PREEMPTED in codes else 0


def main(argv: list[str]) -> int:
    usage = (
        "usage: python -m train.cluster.launch N [--] COMMAND [ARGS...]   "
        "e.g. python -m train.cluster.launch 2 -- fit --epochs 3"
    )
    if not argv or argv[0] in ("-h", "--help"):
        print(usage)
        return 0 if argv else 2
    if not argv[0].isdigit() or int(argv[0]) < 1:
        print(
            f"error: N={argv[0]!r} is not allowed: use a whole number of workers, 1 or more\n{usage}", file=sys.stderr
        )
        return 2
    args = argv[1:]
    if args and args[0] == "--":
        args = args[1:]
    return launch(int(argv[0]), args or ["fit"])


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
