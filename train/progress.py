"""What a run says while it trains: a live bar on a terminal, lines everywhere else (PROGRESS).

The line format is kept stable for scripts that grep it, one line every LOG_EVERY steps:

    step     40/80  epoch 1/2  loss 0.4321  accuracy 0.8750  12,345 examples/s

While a path DATASET is written, a `Counter` shows the files or rows done (a bar, or a line every LINE_SECONDS).

The bar (rich, which typer brings) shows the step of the total, the epoch, the loss and every compiled
metric, examples/s and the time left, updated after every call. Under multi-worker the chief shows the
progress and the other workers say only what matters (their start, their end, and what goes wrong).
"""

from __future__ import annotations

import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager

from train.hooks import CallResult, Hook, Metrics, Say

EVALUATION_NOTICE_SECONDS = 2.0  # an evaluation that takes longer than this says that it runs
LINE_SECONDS = 4.0  # a Counter's lines, off a terminal: between a table's reading and writing, 8 s at most


def format_metrics(metrics: dict[str, float | list]) -> str:
    """loss first, then every other metric as `name value`, two spaces apart."""
    if not metrics:  # a model's own train_step, without a compiled loss or a test_step: nothing to score
        return "not evaluated (its own train_step has no test_step beside it)"
    parts = []
    for name, value in metrics.items():
        shown = f"{value:.4f}" if isinstance(value, float) else "[" + ", ".join(_flat(value)) + "]"
        parts.append(f"{name} {shown}")
    return "  ".join(parts)


def _flat(value: float | list) -> list[str]:
    if isinstance(value, list):
        return [text for item in value for text in _flat(item)]
    return [f"{value:.4f}"]


@contextmanager
def evaluation_notice(say: Say, split: str, examples: int) -> Iterator[None]:
    """Around an evaluation: said if it takes more than a moment (a large split, a slow model)."""
    timer = threading.Timer(EVALUATION_NOTICE_SECONDS, say, args=(f"evaluating {split} ({examples:,} examples)...",))
    timer.daemon = True
    timer.start()
    try:
        yield
    finally:
        timer.cancel()


class Counter:
    """Work done so far of `total` (None: not known yet) with its rate: the files a folder's writing reads, a table's
    rows read then written (train.data.written). A transient bar where `shown` (None: where stdout is a terminal),
    else a line through `say` every LINE_SECONDS, from a thread: a pass that advances nothing for a while (a table's
    columns being typed) still gets its lines. `close` it (in a `finally`)."""

    def __init__(self, what: str, total: int | None, say: Say, unit: str = "files", shown: bool | None = None) -> None:
        self.what, self.total, self.say, self.unit = what, total, say, unit
        self.done, self.start = 0, time.monotonic()
        self.last, self.bar, self.closed = self.start, None, threading.Event()
        if sys.stdout.isatty() if shown is None else shown:
            from rich.progress import Progress

            self.bar = Progress(*Progress.get_default_columns(), "{task.fields[rate]}", transient=True)
            self.task = self.bar.add_task(what, total=total, rate="")
            self.bar.start()
        else:
            threading.Thread(target=self._lines, daemon=True).start()

    def rate(self) -> str:
        return f"{self.done / max(time.monotonic() - self.start, 1e-9):,.0f} {self.unit}/s"

    def _lines(self) -> None:
        while not self.closed.wait(LINE_SECONDS):
            of = "" if self.total is None else f"/{self.total:,}"
            self.say(f"{self.what}: {self.done:,}{of} {self.unit}, {self.rate()}")

    def advance(self, count: int = 1) -> None:
        self.done += count
        now = time.monotonic()
        if self.bar is not None and (now - self.last > 0.1 or self.done == self.total):
            self.bar.update(self.task, completed=self.done, rate=self.rate())
            self.last = now

    def close(self) -> None:
        self.closed.set()
        if self.bar is not None:
            self.bar.stop()


class Lines(Hook):
    """Plain lines: container logs, CI, `| tee`. A hook between the loop's calls (train.hooks): the lines wait for
    `log` and an epoch's end, where the bar moves after every call."""

    def __init__(self, say: Say, total_steps: int, epoch_of: Callable[[int], int], epochs: int) -> None:
        self.say, self.total, self.epoch_of, self.epochs = say, total_steps, epoch_of, epochs

    def log(self, step: int, result: CallResult, examples_per_sec: float | None) -> None:
        epoch, metrics = self.epoch_of(step), format_metrics(result.metrics)
        speed = f"{examples_per_sec:,.0f} examples/s" if examples_per_sec else "(first call: tracing)"
        self.say(f"step {step:>7}/{self.total}  epoch {epoch}/{self.epochs}  {metrics}  {speed}")

    def evaluating(self, split: str, examples: int) -> AbstractContextManager[None]:
        return evaluation_notice(self.say, split, examples)

    def epoch_end(self, epoch: int, step: int, metrics: Metrics) -> None:
        self.say(f"epoch {epoch} eval: {format_metrics(metrics)}")


class Quiet(Lines):
    """A worker other than the chief: its start and end, not every step (the chief shows those)."""

    def log(self, step: int, result: CallResult, examples_per_sec: float | None) -> None:
        pass

    def epoch_end(self, epoch: int, step: int, metrics: Metrics) -> None:
        pass


class Bar(Lines):
    """A live bar on a terminal; what the lines would say stays above it, epoch by epoch."""

    def __init__(
        self, say: Say, total_steps: int, epoch_of: Callable[[int], int], epochs: int, start_step: int = 0
    ) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

        super().__init__(say, total_steps, epoch_of, epochs)
        self.console = Console(file=sys.stdout)
        self.progress = Progress(
            TextColumn("epoch {task.fields[epoch]}"),
            BarColumn(),
            MofNCompleteColumn(),
            TextColumn("{task.fields[metrics]}"),
            TextColumn("{task.fields[speed]}"),
            TextColumn("ETA"),
            TimeRemainingColumn(),
            console=self.console,
            transient=False,
        )
        self.task = self.progress.add_task(
            "train", total=total_steps, completed=start_step, epoch=self._epoch(start_step), metrics="", speed=""
        )
        self.progress.start()

    def _epoch(self, step: int) -> str:
        return f"{max(1, self.epoch_of(step))}/{self.epochs}"

    def after_call(self, step: int, result: CallResult, skipped: int, examples_per_sec: float | None) -> None:
        speed = f"{examples_per_sec:,.0f} examples/s" if examples_per_sec else ""
        self.progress.update(
            self.task, completed=step, epoch=self._epoch(step), metrics=format_metrics(result.metrics), speed=speed
        )

    def log(self, step: int, result: CallResult, examples_per_sec: float | None) -> None:
        self.after_call(step, result, 0, examples_per_sec)

    @contextmanager
    def evaluating(self, split: str, examples: int) -> Iterator[None]:
        with self.console.status(f"evaluating {split} ({examples:,} examples)..."):
            yield

    def epoch_end(self, epoch: int, step: int, metrics: Metrics) -> None:
        self.progress.console.print(f"epoch {epoch} eval: {format_metrics(metrics)}", highlight=False, markup=False)

    def close(self) -> None:
        self.progress.stop()


def reporter(
    mode: str, chief: bool, say: Say, total_steps: int, epoch_of: Callable[[int], int], epochs: int, start: int
) -> Lines:
    """PROGRESS resolved: auto is a bar where stdout is a terminal (and this is the chief), else lines.
    `epoch_of(step)`: the epoch (from 1) a step belongs to."""
    if not chief:
        return Quiet(say, total_steps, epoch_of, epochs)
    if mode == "bar" or (mode == "auto" and sys.stdout.isatty()):
        return Bar(say, total_steps, epoch_of, epochs, start)
    return Lines(say, total_steps, epoch_of, epochs)
