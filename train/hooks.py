"""The hook interface: what happens around and between a run's training calls, as an ordered list of typed hooks.

A `Hook` overrides only the moments it acts at. The engine's own duties between calls are hooks (train.run_hooks),
and so are the plug-ins' (train/plugins: TRACKING's tracker, a tune's trial) and those a fork's MODEL file returns
from `build_hooks(context)` (docs/fork.md, Hooks). A run meets the moments in this order:

    run_begin(run)                     once a start, its run directory open: what it returns goes into run.json
    should_stop, before_call           before every call, outermost first (the first hook that says stop ends it)
    after_call, log, epoch_end, save   after a call, innermost first
    close                              the loop is left, whichever way (an error included), innermost first
    summary()                          the run's end (a stop included): what it returns goes into summary.json
    run_end(summary)                   the run is over: summary.json as written, None where the run failed

Where each hook sits in the list, and why, is written once: train.run_hooks.between_calls. Nothing here imports
TensorFlow or the engine, so a plug-in that imports this module reaches the run through it alone.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

Metrics = dict[str, float | list]  # metric names to numbers (a metric of several values: a list), JSON-ready
Json = dict[str, object]
Say = Callable[[str], None]


@dataclass(frozen=True)
class CallResult:
    """What a training call reports: the metrics since their last reset (the epoch's start) and how many of its
    steps float16 loss scaling skipped because the gradients overflowed."""

    metrics: Metrics
    skipped: int

    @property
    def loss(self) -> float:
        """The "loss" metric. A model's own train_step may name its losses otherwise (a GAN's d_loss, g_loss):
        then the first of those that is not finite, else the first, else 0.0 (no loss to watch)."""
        if "loss" in self.metrics:
            return float(self.metrics["loss"])
        losses = [value for name, value in self.metrics.items() if name.endswith("loss") and isinstance(value, float)]
        return next((value for value in losses if not math.isfinite(value)), losses[0] if losses else 0.0)


@dataclass(frozen=True)
class RunInfo:
    """The run as a hook is told of it at `run_begin`: once a start, its run directory open and its checkpoint
    restored, before run.json is written."""

    output_dir: Path
    settings: dict[str, str]  # every setting as text, HP_ ones included: as settings.json holds them
    hyperparameters: Json  # the settings typed, and what the run resolved (replicas, global_batch, precision, xla...)
    data: Json  # the data's identity: run.json's "data"
    recorded: Json  # run.json as this start found it ({} at a run's first start, and on the workers but the chief)
    step: int  # the step this start trains from
    resumed: bool  # whether a checkpoint was restored (False: the run's first start)
    direction: Callable[[str], str | None]  # a metric's "max" or "min" on this model, as Keras's mode="auto" tells
    say: Say  # the run's lines (stdout)


class Hook:
    """One duty around and between calls. Every method does nothing unless a hook overrides it.

    `save_on_stop`: where this hook's `should_stop` ends the run, the loop first saves the step (through every
    hook's `save`) unless it is saved already, and the run ends as finished (evaluated, exported); a hook that
    saves on its own and leaves the run to resume (a signal's stop) leaves it False. `chief_only`: called on the
    chief alone, where several workers train (a tracker's), not on the others."""

    save_on_stop = False
    chief_only = False

    def run_begin(self, run: RunInfo) -> Json:
        """Once a start, before the first call: what to add to run.json (keys of its own; None adds nothing)."""
        return {}

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
        """Epoch `epoch` (from 1) ended at `step` and was evaluated: `metrics` (evaluation's, without val_)."""

    def save(self, step: int, skipped: int) -> None:
        """Every CHECKPOINT_EVERY steps, at an epoch's end and at the end of training."""

    def close(self) -> None:
        """The loop is left, whichever way (an error included)."""

    def summary(self) -> Json:
        """The run's end, a stop included, before summary.json is written: what to add to it (as run_begin's)."""
        return {}

    def run_end(self, summary: Json | None) -> None:
        """The run is over: `summary` as summary.json holds it, or None where the run failed."""


MOMENTS = tuple(name for name in vars(Hook) if not name.startswith("_") and callable(vars(Hook)[name]))
