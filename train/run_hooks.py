"""The engine's own hooks between training calls (the interface: train.hooks), and the one place their order is
written (`between_calls`), for each attempt of `fit`'s loop (AUTO_BATCH retries at a smaller batch).

The loop (train.loop.run_loop) calls the list as nested context managers would run: `should_stop` and
`before_call` outermost first, the others innermost first. The plug-ins' hooks and MODEL's (`build_hooks`) take
their place in it beside the engine's.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from pathlib import Path

import tensorflow as tf

from train.checkpoints import RunCheckpoint
from train.cluster.workers import SingleHost
from train.errors import TrainingError
from train.hooks import CallResult, Hook, Metrics, Say
from train.model import Built
from train.writer import SummaryWriters


class Profiler(Hook):
    """PROFILE_STEPS: the trace starts before step START (counted from 1) and stops after step END, into logs/;
    said where a start resumes past or inside the range. The chief's alone (its role makes it: train.fit)."""

    def __init__(self, steps: tuple[int, int] | None, text: str, output_dir: Path, say: Say, start: int) -> None:
        """`steps`: PROFILE_STEPS, (START, END); `text`: as the setting was written."""
        self.range, self.text, self.output_dir, self.say = steps, text, output_dir, say
        self.profiling = False
        if self.range:
            if start >= self.range[1]:
                say(
                    f"PROFILE_STEPS={self.text}: those steps were trained before this start (at step {start}): no "
                    "trace."
                )
            elif start >= self.range[0]:
                say(
                    f"PROFILE_STEPS={self.text}: resumed at step {start}, inside the range: tracing steps "
                    f"{start + 1}-{self.range[1]}."
                )

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

    def __init__(self, peers: SingleHost) -> None:
        self.peers = peers

    def should_stop(self, step: int, saved_step: int, skipped: int) -> bool:
        return self.peers.should_stop(step, saved_step)


def write_scalars(writer: tf.summary.SummaryWriter, step: int, metrics: Metrics, **extra: float | None) -> None:
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


class FiniteLoss(Hook):
    """After every call, before anything reports it: a loss that is no longer a number ends the run, told as a
    float16 overflow or a divergence.

    Under loss scaling an overflowed step is skipped (and counts in no metric): that is an overflow, and
    training goes on. A non-finite loss at a finite scale, or a scale that fell below 1, is a divergence.
    """

    def __init__(self, built: Built, checkpoint: RunCheckpoint) -> None:
        self.built, self.checkpoint = built, checkpoint

    def after_call(self, step: int, result: CallResult, skipped: int, examples_per_sec: float | None) -> None:
        loss, loss_scale = result.loss, self.built.loss_scale
        kept = f"stopped without saving these weights (last good checkpoint: {self.checkpoint.latest})"
        if loss_scale is None:
            if not math.isfinite(loss):
                raise TrainingError(
                    f"the training loss became {loss} by step {step}; {kept}. Try a lower LEARNING_RATE."
                )
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


def between_calls(
    *,
    profiler: Hook,
    callbacks: Hook,
    stops: Hook,
    plugged: Sequence[Hook],
    scalars: Hook,
    progress: Hook,
    finite_loss: Hook,
    checkpoints: Hook,
) -> list[Hook]:
    """The hooks between calls, outermost first: the one place their order is written. So, as the loop has always
    run them: the profiler starts before the callbacks' batch hook and stops after it; a callback's
    `model.stop_training` is heard before a signal; the loss is checked before anything reports it; the progress
    line comes before TensorBoard's scalars; an epoch's evaluation is shown and recorded before the callbacks hear
    of it; and a checkpoint is saved before the callbacks keep it as MONITOR's best.

    `plugged`: the plug-ins' hooks (a tune's trial, then TRACKING's tracker: train.plugins.fit_hooks), then MODEL's
    (build_hooks), in that order, between the signals and the scalars: a trial says stop after a signal, and each
    hears a log or an epoch's end after it is shown and written to TensorBoard."""
    return [profiler, callbacks, stops, *plugged, scalars, progress, finite_loss, checkpoints]
