"""Chief or worker, decided once (`take_role`): the `Role` a process plays in its run.

It holds the run's `peers` (the other workers, behind the `Peers` protocol: `SingleHost` or `Workers`), its
writer (train.writer: the chief's writes OUTPUT_DIR, another worker's nothing), and everything only the chief
does: the checkpoint rotation's one exception (MONITOR's best epoch kept beyond KEEP_CHECKPOINTS, through
train.keras_seams), crash.log, and what only the chief runs (`chief_only`: the profiler, train.fit; what it
computes alone before it shares it). The engine asks the role to do these, and never which worker it is on: a
`Chief` does them, any other worker's `Role` does not.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from pathlib import Path
from typing import Generic, Protocol, TypeVar

import tensorflow as tf

from train.cluster.workers import Report, Say, StopRequest, WorkerCheckpoints, connect
from train.devices.runtime import Runtime
from train.keras_seams import rotation
from train.rundir import CRASH_LOG

T = TypeVar("T")
W = TypeVar("W")
W_co = TypeVar("W_co", covariant=True)


class CheckpointSaver(Protocol):
    """What saves the run's checkpoints (`Peers.checkpoint_manager`): a tf.train.CheckpointManager, or its
    counterpart that saves on every worker at once (train.cluster.workers.WorkerCheckpoints)."""

    checkpoint: tf.train.Checkpoint
    directory: str

    @property
    def latest_checkpoint(self) -> str | None: ...

    def save(self, checkpoint_number: int) -> str | None: ...


class Peers(Protocol):
    """The other workers of the run (none for one process): what the engine asks of them, alike on every worker.
    `SingleHost` and `Workers` (train.cluster.workers) answer it; which one, and which worker this is, the engine
    does not ask."""

    @property
    def worker_index(self) -> int: ...

    @property
    def workers(self) -> int: ...

    def all_gather(self, name: str, own: Report) -> list[Report]: ...

    def share_from_chief(self, name: str, value: str) -> str: ...

    def checkpoint_manager(self, checkpoint: tf.train.Checkpoint, directory: Path, keep: int) -> CheckpointSaver: ...

    def refuse_if_busy(self, output_dir: Path) -> None: ...

    def restore(self, checkpoint: tf.train.Checkpoint, directory: Path, say: Say) -> str | None: ...

    def watch_stops(self, save: Callable[[int], None]) -> None: ...

    def should_stop(self, step: int, saved_step: int) -> bool: ...

    def stopped_by(self) -> str: ...

    def agree_on_weights(self, fingerprint: str) -> None: ...

    def done(self) -> None: ...

    def close(self) -> None: ...

    def guard(self, doing: str, checkpoint_dir: Path | None = None) -> contextlib.AbstractContextManager[None]: ...


class Writers(Protocol[W_co]):
    """The two writers a role may hold (train.writer.Writers) for OUTPUT_DIR: the chief's, and the silent one of
    the others; `say`: what the process says (a warning crash.log could not be written, say)."""

    @property
    def output_dir(self) -> Path: ...

    @property
    def say(self) -> Say: ...

    def chief(self) -> W_co: ...

    def other(self) -> W_co: ...


class Role(Generic[W]):
    """A worker other than the chief: it trains with the others, and does nothing only the chief does."""

    def __init__(self, peers: Peers, writer: W, output_dir: Path, say: Say) -> None:
        self.peers, self.writer, self.output_dir, self.say = peers, writer, output_dir, say

    def facts(self) -> dict[str, bool]:
        """What the MODEL file's context says of this worker (train.context.Context)."""
        return {"is_chief": False}

    def joined(self, address: str) -> str:
        """The line a worker says once every worker has joined."""
        return f"Worker {self.peers.worker_index} of {self.peers.workers} ({address}): all workers joined."

    def chief_only(self, work: Callable[..., T], *args: object) -> T | None:
        """`work(*args)` on the chief (what only it does, or computes alone before it shares it); None on every
        other worker."""
        return None

    def decided(self, name: str, value: bool, why: str) -> tuple[bool, str]:
        """The chief's `value` on every worker, and why: the chief's reason, or that the chief decided."""
        return self.peers.share_from_chief(name, "1" if value else "0") == "1", "as the chief decided"

    def checkpoint_manager(self, checkpoint: tf.train.Checkpoint, directory: Path, keep: int) -> CheckpointSaver:
        """What saves the run's checkpoints (the peers'), KEEP_CHECKPOINTS of them kept by the chief's rotation."""
        return self.peers.checkpoint_manager(checkpoint, directory, keep)

    def holds_checkpoint(self, step: int) -> bool:
        """Whether the chief's checkpoints hold ckpt-<step> (every other worker takes the chief's word for it)."""
        return True

    def keep_out_of_rotation(self, step: int) -> None:
        """Keep ckpt-<step> whatever KEEP_CHECKPOINTS says (the best epoch's): the chief's rotation."""

    def drop_kept(self, step: int) -> None:
        """Delete ckpt-<step> where it was kept out of the rotation (a best epoch no longer the best)."""

    def crash(self, text: str) -> Path | None:
        """`text` appended to OUTPUT_DIR/crash.log, what a bug left to report; where (None: not written here)."""
        return None


class Chief(Role[W]):
    """The chief (or the only process): it writes OUTPUT_DIR, rotates the checkpoints and keeps crash.log."""

    def __init__(self, peers: Peers, writer: W, output_dir: Path, say: Say) -> None:
        super().__init__(peers, writer, output_dir, say)
        self._rotating: tf.train.CheckpointManager | None = None

    def facts(self) -> dict[str, bool]:
        return {"is_chief": True}

    def joined(self, address: str) -> str:
        return (
            f"Worker {self.peers.worker_index} of {self.peers.workers} ({address}, chief: writes {self.output_dir}): "
            "all workers joined."
        )

    def chief_only(self, work: Callable[..., T], *args: object) -> T | None:
        return work(*args)

    def decided(self, name: str, value: bool, why: str) -> tuple[bool, str]:
        self.peers.share_from_chief(name, "1" if value else "0")
        return value, why

    def checkpoint_manager(self, checkpoint: tf.train.Checkpoint, directory: Path, keep: int) -> CheckpointSaver:
        manager = super().checkpoint_manager(checkpoint, directory, keep)
        rotating = manager.rotating if isinstance(manager, WorkerCheckpoints) else manager
        assert isinstance(rotating, tf.train.CheckpointManager), "a CheckpointManager rotates the chief's"
        self._rotating = rotating
        return manager

    def _rotation(self) -> dict[str, float]:
        assert self._rotating is not None, "checkpoint_manager first"
        return rotation(self._rotating)

    def holds_checkpoint(self, step: int) -> bool:
        assert self._rotating is not None, "checkpoint_manager first"
        return (Path(self._rotating.directory) / f"ckpt-{step}.index").exists()

    def keep_out_of_rotation(self, step: int) -> None:
        rotating = self._rotation()
        for prefix in [prefix for prefix in rotating if Path(prefix).name == f"ckpt-{step}"]:
            del rotating[prefix]

    def drop_kept(self, step: int) -> None:
        """Where ckpt-<step> is in the rotation again, it is left to it."""
        if any(Path(prefix).name == f"ckpt-{step}" for prefix in self._rotation()):
            return
        assert self._rotating is not None
        directory = Path(self._rotating.directory)
        for path in (directory / f"ckpt-{step}.index", *directory.glob(f"ckpt-{step}.data-*")):
            path.unlink(missing_ok=True)

    def crash(self, text: str) -> Path | None:
        path = self.output_dir / CRASH_LOG
        try:
            with open(path, "a", encoding="utf-8") as stream:
                stream.write(text)
        except OSError as error:
            self.say(f"warning: could not write {path} ({error.strerror or error}): {text.strip()}")
            return None
        return path


def take_role(runtime: Runtime, stop: StopRequest, timeout_s: float, writers: Writers[W]) -> Role[W]:
    """The one place that decides which worker this process is, once the cluster has formed (`connect`): the chief
    (or the only process) gets a `Chief` and the chief's writer, every other worker a `Role` and a writer that writes
    nothing. `stop`: the SIGTERM/Ctrl-C flag; `timeout_s`: how long a worker waits for another's answer."""
    peers = connect(runtime, stop, timeout_s)
    if peers.is_chief:
        return Chief(peers, writers.chief(), writers.output_dir, writers.say)
    return Role(peers, writers.other(), writers.output_dir, writers.say)
