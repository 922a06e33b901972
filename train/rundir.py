"""The run directory: proven writable before any device work, and the checkpoints found in it.

No TensorFlow here: a wrong UID on a mounted volume or a full disk is caught in the first second.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import re
import signal
import socket
import sys
import time
from pathlib import Path
from typing import Any

from train.errors import BusyError, SettingsError
from train.settings import Settings, model_fingerprint

PROBE_BYTES = 1 << 20  # a write of this size must succeed: a nearly full disk fails here, not at step 10,000
MIN_FREE_BYTES = 64 << 20  # room for a few checkpoints of a small model, the export and the logs


def write_json(path: Path, payload: Any) -> None:
    """JSON for scripts and later runs. A regular file is replaced whole or not at all (through a temporary
    file beside it, where a symlink points); a pipe or /dev/stdout is written to as it is. Raises OSError."""
    text = json.dumps(payload, indent=2) + "\n"
    target = Path(os.path.realpath(path))
    if target.exists() and not target.is_file():
        target.write_text(text)
        return
    temporary = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        temporary.write_text(text)
        os.replace(temporary, target)
    finally:
        temporary.unlink(missing_ok=True)


def check_output_dir(path: Path) -> None:
    """Write and remove a probe file where the run will write. Raises SettingsError naming path and UID."""
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        raise SettingsError(f"OUTPUT_DIR={path} cannot be created: {existing} is a file")
    probe = existing / f".write-probe-{os.getpid()}"
    created = False
    try:
        with open(probe, "wb") as stream:
            created = True
            stream.write(b"\0" * PROBE_BYTES)
            stream.flush()
            os.fsync(stream.fileno())
        stats = os.statvfs(existing)
        free = stats.f_bavail * stats.f_frsize
    except OSError as error:
        if error.errno == errno.ENOSPC:
            raise SettingsError(f"OUTPUT_DIR={path} is on a full filesystem: free space at {existing}") from None
        if error.errno == errno.EDQUOT:
            raise SettingsError(f"OUTPUT_DIR={path} is over its disk quota: free space at {existing}") from None
        if error.errno in (errno.EACCES, errno.EPERM):
            fix = "fix the owner or permissions (docker: build the image with this UID), or use another OUTPUT_DIR"
        else:  # a read-only or special filesystem (/proc): no owner to fix
            fix = "use another OUTPUT_DIR"
        raise SettingsError(
            f"OUTPUT_DIR={path} is not writable by UID {os.getuid()} ({error.strerror} at {existing}): {fix}"
        ) from None
    finally:
        if created:
            probe.unlink(missing_ok=True)
    if free < MIN_FREE_BYTES:
        raise SettingsError(
            f"OUTPUT_DIR={path} has {free >> 20} MiB free at {existing}; "
            f"a run needs at least {MIN_FREE_BYTES >> 20} MiB"
        )


LOCK = ".lock"  # in OUTPUT_DIR: held (flock) by the process that trains there; it says who that is
RUN = "run.json"  # in OUTPUT_DIR: what the run's first start resolved (model hash, XLA, data in memory, precision)


class RunLock:
    """One writer per run directory: an exclusive flock on OUTPUT_DIR/.lock, held until the process ends.

    The kernel drops the lock when its holder dies (SIGKILL, a lost pod's process), so a stale lock never
    blocks; the file only says who holds it. Local filesystems honour it across processes; NFSv4 too (a dead
    node's lock lasts until its lease ends, ~90 s); FUSE mounts such as gcsfuse lock per host only.
    """

    def __init__(self, output_dir: Path) -> None:
        self.output_dir = output_dir
        self._stream: Any = None

    @property
    def path(self) -> Path:
        return self.output_dir / LOCK

    def acquire(self) -> None:
        """Take the lock, creating OUTPUT_DIR if needed, or raise BusyError naming the holder (writes nothing)."""
        self.output_dir.mkdir(parents=True, exist_ok=True)
        stream = open(self.path, "a+")  # noqa: SIM115 (held open for the process's life: the lock is its descriptor)
        try:
            fcntl.flock(stream, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as error:
            stream.close()
            if error.errno in (errno.EAGAIN, errno.EACCES):
                raise busy(self.output_dir) from None
            raise SettingsError(f"OUTPUT_DIR={self.output_dir} cannot be locked ({error.strerror})") from None
        stream.seek(0)
        stream.truncate()
        stream.write(json.dumps({"host": socket.gethostname(), "pid": os.getpid(), "since": time.time()}) + "\n")
        stream.flush()
        self._stream = stream

    def release(self) -> None:
        if self._stream is not None:
            self._stream.close()  # closing the descriptor releases the lock
            self._stream = None


def holder(output_dir: Path) -> str | None:
    """Who holds OUTPUT_DIR's lock right now ("pid 123 on host h"), or None if nobody does. Takes nothing."""
    path = output_dir / LOCK
    try:
        stream = open(path)  # noqa: SIM115
    except OSError:
        return None
    with stream:
        try:
            fcntl.flock(stream, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except OSError:
            try:
                info = json.loads(stream.read() or "{}")
                return f"pid {info['pid']} on host {info['host']}"
            except (ValueError, KeyError, TypeError):
                return "another process"
        fcntl.flock(stream, fcntl.LOCK_UN)
    return None


def busy(output_dir: Path) -> BusyError:
    who = holder(output_dir) or "another process"
    return BusyError(
        f"OUTPUT_DIR={output_dir} is in use: {who} trains in it. Nothing was written; run again once it has "
        "ended (a restart policy may retry), or use another OUTPUT_DIR"
    )


def read_run(output_dir: Path) -> dict[str, Any]:
    """What the run's first start resolved (empty for a new run, or a file that is not ours)."""
    with contextlib.suppress(OSError, ValueError):
        recorded = json.loads((output_dir / RUN).read_text())
        if isinstance(recorded, dict):
            return recorded
    return {}


def check_same_model(settings: Settings) -> None:
    """A run directory holding checkpoints of another model is refused in one line (they would not load)."""
    recorded = read_run(settings.output_dir).get("model_sha256")
    if not recorded or not checkpoints_newest_first(settings.output_dir / "checkpoints"):
        return
    now = model_fingerprint(settings.model)
    if now != recorded:
        raise SettingsError(
            f"MODEL={settings.model!r} is not the model OUTPUT_DIR={settings.output_dir} was trained with: its code "
            f"differs (sha256 {now[:12]}, the run's {recorded[:12]}), so the run's checkpoints would not load into "
            "it. Use another OUTPUT_DIR for this model, or put the run's model back"
        )


def preflight(settings: Settings) -> None:
    """Everything about the run directory that can be known before TensorFlow loads."""
    check_output_dir(settings.output_dir)
    check_same_model(settings)
    # Across workers the chief says it once they have joined (train.cluster.workers), so that every worker ends
    # with the same exit code: a worker that stopped here would leave the others waiting for it.
    if not settings.multi_worker and holder(settings.output_dir) is not None:
        raise busy(settings.output_dir)
    existing = checkpoints_newest_first(settings.output_dir / "checkpoints")
    if existing and settings.resume == "never":
        raise SettingsError(
            f"RESUME=never but OUTPUT_DIR={settings.output_dir} already holds checkpoints ({existing[0].name}): "
            "use another OUTPUT_DIR, delete that one, or RESUME=auto"
        )


def checkpoints_newest_first(checkpoint_dir: Path) -> list[Path]:
    """Every checkpoint in this directory (prefixes like .../ckpt-120), newest first.

    Found by listing the directory, not by trusting the `checkpoint` state file: that file can name
    paths outside the run directory, and can be behind the files after a kill.
    """
    numbered = []
    for index in checkpoint_dir.glob("ckpt-*.index"):
        match = re.fullmatch(r"ckpt-(\d+)\.index", index.name)
        if match:
            numbered.append((int(match.group(1)), checkpoint_dir / f"ckpt-{match.group(1)}"))
    return [prefix for _, prefix in sorted(numbered, reverse=True)]


class StopRequest:
    """SIGTERM (docker stop, Kubernetes, spot preemption) or Ctrl-C: finish the step, save, leave.

    The handler only sets a flag; the loop looks at it between calls. A second Ctrl-C stops at once.
    """

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: dict[int, Any] = {}

    def _handle(self, signum: int, frame: Any) -> None:
        if self.signal_name and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(signum).name
        if signum == signal.SIGINT:  # someone at a terminal: say it was heard (SIGTERM's senders read the exit code)
            print(
                "Ctrl-C: stopping at the next safe point (after the current call, with a checkpoint); "
                "Ctrl-C again stops at once.",
                file=sys.stderr,
                flush=True,
            )

    def __enter__(self) -> StopRequest:
        for signum in (signal.SIGTERM, signal.SIGINT):
            self._previous[signum] = signal.signal(signum, self._handle)
        return self

    def rearm(self) -> None:
        """Install the handlers again, keeping what __enter__ saved. MultiWorkerMirroredStrategy's C++
        preemption notifier replaces the SIGTERM handler when the cluster forms, and only logs the signal."""
        for signum in self._previous:
            signal.signal(signum, self._handle)

    def __exit__(self, *exc: Any) -> None:
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)
