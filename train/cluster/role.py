"""Chief or worker, decided once (`take_role`): the `Role` a process plays in its run.

It holds the run's `peers` (the other workers: `SingleHost`, or `Workers` under MultiWorkerMirroredStrategy), its
writer (train.writer: the chief's writes OUTPUT_DIR, another worker's nothing), and everything only the chief
does: crash.log, and what only the chief runs (`chief_only`: the profiler, train.fit; what it computes alone before
it shares it). The checkpoint rotation's one exception (MONITOR's best epoch) is the chief's checkpoints'
(train.cluster.workers.WorkerCheckpoints). The engine asks the role to do these, and never which worker it is on:
a `Chief` does them, any other worker's `Role` does not.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import ParamSpec, TypeVar

from train.cluster.workers import SingleHost, StopRequest, connect
from train.devices.runtime import Runtime
from train.hooks import Say
from train.rundir import CRASH_LOG
from train.writer import ChiefWriter, Writer

T = TypeVar("T")
P = ParamSpec("P")


class Role:
    """A worker other than the chief: it trains with the others, and does nothing only the chief does."""

    def __init__(self, peers: SingleHost, writer: Writer, output_dir: Path, say: Say) -> None:
        self.peers, self.writer, self.output_dir, self.say = peers, writer, output_dir, say

    def facts(self) -> dict[str, bool]:
        """What the MODEL file's context says of this worker (train.context.Context)."""
        return {"is_chief": False}

    def joined(self, address: str) -> str:
        """The line a worker says once every worker has joined."""
        return f"Worker {self.peers.worker_index} of {self.peers.workers} ({address}): all workers joined."

    def chief_only(self, work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T | None:
        """`work(*args, **kwargs)` on the chief (what only it does, or computes alone before it shares it); None on
        every other worker."""
        return None

    def decided(self, name: str, value: bool, why: str) -> tuple[bool, str]:
        """The chief's `value` on every worker, and why: the chief's reason, or that the chief decided."""
        return self.peers.share_from_chief(name, "1" if value else "0") == "1", "as the chief decided"

    def crash(self, text: str) -> Path | None:
        """`text` appended to OUTPUT_DIR/crash.log, what a bug left to report; where (None: not written here)."""
        return None


class Chief(Role):
    """The chief (or the only process): it writes OUTPUT_DIR and keeps crash.log."""

    def facts(self) -> dict[str, bool]:
        return {"is_chief": True}

    def joined(self, address: str) -> str:
        return (
            f"Worker {self.peers.worker_index} of {self.peers.workers} ({address}, chief: writes {self.output_dir}): "
            "all workers joined."
        )

    def chief_only(self, work: Callable[P, T], *args: P.args, **kwargs: P.kwargs) -> T | None:
        return work(*args, **kwargs)

    def decided(self, name: str, value: bool, why: str) -> tuple[bool, str]:
        self.peers.share_from_chief(name, "1" if value else "0")
        return value, why

    def crash(self, text: str) -> Path | None:
        path = self.output_dir / CRASH_LOG
        try:
            with open(path, "a", encoding="utf-8") as stream:
                stream.write(text)
        except OSError as error:
            self.say(f"warning: could not write {path} ({error.strerror or error}): {text.strip()}")
            return None
        return path


def take_role(runtime: Runtime, stop: StopRequest, timeout_s: float, output_dir: Path, say: Say) -> Role:
    """The one place that decides which worker this process is, once the cluster has formed (`connect`): the chief
    (or the only process) gets a `Chief` and the chief's writer, every other worker a `Role` and a writer that writes
    nothing. `stop`: the SIGTERM/Ctrl-C flag; `timeout_s`: how long a worker waits for another's answer; `say`: what
    the process says (a warning crash.log could not be written, say)."""
    peers = connect(runtime, stop, timeout_s)
    if peers.is_chief:
        return Chief(peers, ChiefWriter(output_dir, say), output_dir, say)
    return Role(peers, Writer(output_dir, say), output_dir, say)
