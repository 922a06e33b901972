"""SIGTERM (docker stop, Kubernetes, spot preemption) or Ctrl-C, heard while a command works: `StopRequest`, in
force for `fit` (train.cli); `stop_heard`, what the loop (train.run_hooks) asks between its calls; and `dropping`,
the phase in which a path DATASET is written (train.data.written), where a stop raises `Stopped` at once.

Below the run directory and the data, which ask it; of the engine it imports only train.errors. No TensorFlow here.
"""

from __future__ import annotations

import contextlib
import signal
import sys
from collections.abc import Callable, Iterator
from types import FrameType

from train.errors import Stopped

Handler = Callable[[int, FrameType | None], object] | int | signal.Handlers | None  # what signal.signal returns
DROPPED = "stopping: the data being written is dropped"  # a stop's first line while `dropping`


class StopRequest:
    """SIGTERM (docker stop, Kubernetes, spot preemption) or Ctrl-C: finish the step, save, leave.

    The handler only sets a flag; the loop looks at it between calls (`stop_heard`). While a path DATASET is written
    (`dropping`) there is nothing to save: the handler raises Stopped. A second Ctrl-C stops at once.
    """

    def __init__(self) -> None:
        self.signal_name: str | None = None
        self.dropping: str | None = None  # what is being written (`dropping`), for Stopped's message
        self._previous: dict[int, Handler] = {}

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        if self.signal_name and signum == signal.SIGINT:
            raise KeyboardInterrupt
        self.signal_name = signal.Signals(signum).name
        if self.dropping is not None:  # raised wherever the writing is (reading rows, typing them, writing records)
            print(DROPPED, file=sys.stderr, flush=True)
            raise stopped(self.signal_name, self.dropping)
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


def stopped(signal_name: str, doing: str) -> Stopped:
    """What a stop by `signal_name` raises `doing` something ("while ..."): nothing of it was written."""
    return Stopped(f"Stopped by {signal_name} {doing}: nothing was written; run the same command again to go on.")


@contextlib.contextmanager
def dropping(doing: str) -> Iterator[None]:
    """Around work a stop throws away (a path DATASET written into a temporary folder, removed by the caller's
    `finally`): SIGTERM or Ctrl-C heard by a StopRequest in force raises Stopped at once, its message naming what
    was being done, "while DATASET was being written into ...". Raises Stopped on entry where one was heard."""
    heard = stop_heard()
    if heard:
        raise stopped(heard, doing)
    for each in _LISTENING:
        each.dropping = doing
    try:
        yield
    finally:
        for each in _LISTENING:
            each.dropping = None
