"""SIGTERM (docker stop, Kubernetes, spot preemption) or Ctrl-C, heard while a command works: `StopRequest`, in
force for `fit` (train.cli), and `stop_heard`, what the loop (train.run_hooks) and a path DATASET's writing
(train.data.written) ask between their pieces of work.

Below the run directory and the data, which ask it; it imports nothing of the engine. No TensorFlow here.
"""

from __future__ import annotations

import signal
import sys
from collections.abc import Callable
from types import FrameType

Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None  # what signal.signal returns


class StopRequest:
    """SIGTERM (docker stop, Kubernetes, spot preemption) or Ctrl-C: finish the step, save, leave.

    The handler only sets a flag; the loop looks at it between calls, and a path DATASET's writing between files
    (`stop_heard`). A second Ctrl-C stops at once.
    """

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self._previous: dict[int, Handler] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
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
        _LISTENING.append(self)
        return self

    def rearm(self) -> None:
        """Install the handlers again, keeping what __enter__ saved. MultiWorkerMirroredStrategy's C++
        preemption notifier replaces the SIGTERM handler when the cluster forms, and only logs the signal."""
        for signum in self._previous:
            signal.signal(signum, self._handle)

    def __exit__(self, *exc: object) -> None:
        _LISTENING.remove(self)
        for signum, handler in self._previous.items():
            signal.signal(signum, handler)


_LISTENING: list[StopRequest] = []  # the StopRequests in force in this process (fit's)


def stop_heard() -> str | None:
    """The signal (SIGTERM, SIGINT) a StopRequest in force has heard; None where none has, or none is in force (a
    command that stops at once on a signal)."""
    return next((each.signal_name for each in _LISTENING if each.signal_name), None)
