"""What happens between training calls: a short, ordered list of typed hooks (train.loop.run_loop calls them).

Each of the engine's duties between calls is one `Hook`; a hook overrides only the moments it acts at. The list
is ordered outermost first, and the loop calls it as nested context managers would run:

    should_stop, before_call          outermost first (the first hook that says stop ends the loop)
    after_call, log, epoch_end, save, close     innermost first

`between_calls` makes the list, for each attempt of `fit`'s loop (AUTO_BATCH retries at a smaller batch): the
order, and why, are written there and nowhere else.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path

import tensorflow as tf

from train.checkpoints import RunCheckpoint
from train.cluster.role import Peers
from train.errors import TrainingError
from train.model import Built
from train.progress import Lines
from train.step import CallResult
from train.tracking import Tracker
from train.writer import SummaryWriters

Metrics = dict[str, float | list]
Say = Callable[[str], None]


class Hook:
    """One duty between calls. Every method does nothing unless a hook overrides it.

    `save_on_stop`: where this hook's `should_stop` ends the run, the loop first saves the step (through every
    hook's `save`) unless it is saved already; a hook that saves on its own (a cluster's stop) leaves it False."""

    save_on_stop = False

    def should_stop(self, step: int, saved_step: int, skipped: int) -> bool:
        """Before every call, on every worker alike."""
        return False

    def before_call(self, step: int) -> None:
        """The call that starts at `step` is next."""

    def after_call(self, step: int, result: CallResult, skipped: int, examples_per_sec: float | None) -> None:
        """The call ended at `step`; `skipped`: the run's steps skipped so far."""

    def log(self, step: int, result: CallResult, examples_per_sec: float | None) -> None:
        """Every LOG_EVERY steps, at an epoch's end and at the end of training."""

    def epoch_end(self, epoch: int, step: int, metrics: Metrics) -> None:
        """Epoch `epoch` (from 1) ended at `step` and was evaluated: `metrics`."""

    def save(self, step: int, skipped: int) -> None:
        """Every CHECKPOINT_EVERY steps, at an epoch's end and at the end of training."""

    def close(self) -> None:
        """The loop is left, whichever way (an error included)."""


class Profiler(Hook):
    """PROFILE_STEPS: the trace starts before step START (counted from 1) and stops after step END, into logs/;
    said where a start resumes past or inside the range. The chief's alone (its role makes it: train.fit)."""

    def __init__(self, steps: tuple[int, int] | None, text: str, output_dir: Path, say: Say, start: int) -> None:
        """`steps`: PROFILE_STEPS, (START, END); `text`: as the setting was written."""
        self.range, self.text, self.output_dir, self.say = steps, text, output_dir, say
        self.profiling = False
        if self.range:
            if start >= self.range[1]:
                say(f"PROFILE_STEPS={self.text}: those steps were trained before this start (at step {start}): no "
                    "trace.")  # fmt: skip
            elif start >= self.range[0]:
                say(f"PROFILE_STEPS={self.text}: resumed at step {start}, inside the range: tracing steps "
                    f"{start + 1}-{self.range[1]}.")  # fmt: skip

    def before_call(self, step: int) -> None:
        if self.range and not self.profiling and self.range[0] - 1 <= step < self.range[1]:
            tf.profiler.experimental.start(str(self.output_dir / "logs"))
            self.profiling = True

    def after_call(self, step: int, result: CallResult, skipped: int, examples_per_sec: float | None) -> None:
        if self.profiling and self.range and step >= self.range[1]:
            tf.profiler.experimental.stop()
            self.profiling = False
            where = self.output_dir / "logs" / "plugins" / "profile"
            self.say(f"PROFILE_STEPS={self.text}: trace written to {where} (make tensorboard, its Profile tab)")

    def close(self) -> None:
        if self.profiling:
            tf.profiler.experimental.stop()
            self.profiling = False


class StopRequests(Hook):
    """SIGTERM or Ctrl-C (train.signals.StopRequest), heard on every worker at the same call: `peers` saves the
    step (a collective across workers) and says stop."""

    def __init__(self, peers: Peers) -> None:
        self.peers = peers

    def should_stop(self, step: int, saved_step: int, skipped: int) -> bool:
        return self.peers.should_stop(step, saved_step)


def write_scalars(writer, step: int, metrics: Metrics, **extra: float | None) -> None:
    """TensorBoard scalars: every metric, and the extras given. A metric of several values (an F1 score per
    class) is one scalar per value, NAME/0, NAME/1, ...: TensorBoard charts one number per tag."""
    with writer.as_default(step=step):
        for name, value in {**metrics, **extra}.items():
            if isinstance(value, float | int):
                tf.summary.scalar(name, value)
            elif isinstance(value, list):
                for index, each in enumerate(value):
                    if isinstance(each, float | int):
                        tf.summary.scalar(f"{name}/{index}", each)


class Scalars(Hook):
    """TensorBoard: the training metrics and examples/s at every log step, evaluation's at every epoch's end
    (`writers`: train and eval, the writer's: train.writer)."""

    def __init__(self, writers: SummaryWriters) -> None:
        self.writers = writers

    def log(self, step: int, result: CallResult, examples_per_sec: float | None) -> None:
        write_scalars(self.writers["train"], step, result.metrics, examples_per_sec=examples_per_sec or 0.0)

    def epoch_end(self, epoch: int, step: int, metrics: Metrics) -> None:
        write_scalars(self.writers["eval"], step, metrics)


class Tracking(Hook):
    """TRACKING's tracker (train.tracking): the training metrics at every log step, evaluation's at every epoch's
    end, named as epochs.json names them (val_ for evaluation's). The chief's alone (train.fit)."""

    def __init__(self, tracker: Tracker) -> None:
        self.tracker, self.logged_step = tracker, -1

    def log(self, step: int, result: CallResult, examples_per_sec: float | None) -> None:
        if step != self.logged_step:  # an epoch's end and the end of training may log the same step
            self.tracker.metrics(step, result.metrics)
            self.logged_step = step

    def epoch_end(self, epoch: int, step: int, metrics: Metrics) -> None:
        self.tracker.metrics(step, {f"val_{name}": value for name, value in metrics.items()})


class Progress(Hook):
    """The bar or the lines (train.progress, PROGRESS)."""

    def __init__(self, reporter: Lines) -> None:
        self.reporter = reporter

    def after_call(self, step: int, result: CallResult, skipped: int, examples_per_sec: float | None) -> None:
        self.reporter.called(step, result.metrics, examples_per_sec)

    def log(self, step: int, result: CallResult, examples_per_sec: float | None) -> None:
        self.reporter.log(step, result.metrics, examples_per_sec)

    def epoch_end(self, epoch: int, step: int, metrics: Metrics) -> None:
        self.reporter.evaluated(epoch, metrics)

    def close(self) -> None:
        self.reporter.close()


def check_finite(result: CallResult, step: int, loss_scale: float | None, skipped: int, last_checkpoint) -> None:
    """Stop on a loss that is no longer a number, telling a float16 overflow from a divergence.

    Under loss scaling an overflowed step is skipped (and counts in no metric): that is an overflow, and
    training goes on. A non-finite loss at a finite scale, or a scale that fell below 1, is a divergence.
    """
    loss = result.loss
    kept = f"stopped without saving these weights (last good checkpoint: {last_checkpoint})"
    if loss_scale is None:
        if not math.isfinite(loss):
            raise TrainingError(f"the training loss became {loss} by step {step}; {kept}. Try a lower LEARNING_RATE.")
        return
    if loss_scale < 1:
        raise TrainingError(
            f"training diverged by step {step}: float16 overflowed so often that the loss scale fell to "
            f"{loss_scale:g} ({skipped} steps skipped); {kept}. Try a lower LEARNING_RATE, or "
            "MIXED_PRECISION=mixed_bfloat16 (compute capability 8.0+) or off."
        )
    if not math.isfinite(loss):
        raise TrainingError(
            f"training diverged by step {step}: the loss became {loss} at loss scale {loss_scale:g} (an overflow "
            f"would have been skipped: {skipped} were); {kept}. Try a lower LEARNING_RATE."
        )


class FiniteLoss(Hook):
    """After every call, before anything reports it: a loss that is not a number ends the run (`check_finite`)."""

    def __init__(self, built: Built, checkpoint: RunCheckpoint) -> None:
        self.built, self.checkpoint = built, checkpoint

    def after_call(self, step: int, result: CallResult, skipped: int, examples_per_sec: float | None) -> None:
        check_finite(result, step, self.built.loss_scale, skipped, self.checkpoint.latest)


class Checkpoints(Hook):
    """The step saved at every CHECKPOINT_EVERY step, epoch end and the end (a collective across workers)."""

    def __init__(self, checkpoint: RunCheckpoint) -> None:
        self.checkpoint = checkpoint

    def save(self, step: int, skipped: int) -> None:
        self.checkpoint.save(step, skipped)


def between_calls(
    *, profiler: Hook, callbacks: Hook, stops: Hook, trial: Hook, scalars: Hook, tracking: Hook, progress: Hook,
    finite_loss: Hook, checkpoints: Hook,
) -> list[Hook]:  # fmt: skip
    """The hooks between calls, outermost first: the one place their order is written. So, as the loop has always
    run them: the profiler starts before the callbacks' batch hook and stops after it; a callback's
    `model.stop_training` is heard before a signal; the loss is checked before anything reports it; the progress
    line comes before the tracker's metrics (TRACKING) and TensorBoard's scalars; an epoch's evaluation is shown
    and recorded before the callbacks hear of it; and a checkpoint is saved before the callbacks keep it as
    MONITOR's best. A tune's trial (train.trial) says stop after a signal, and hears an epoch's end after it is
    shown and recorded."""
    return [profiler, callbacks, stops, trial, scalars, tracking, progress, finite_loss, checkpoints]
