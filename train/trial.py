"""A fit run as one of `tune`'s trials (TUNE_TRIAL set, train.study.TrialRef): each epoch's objective reported to the
trial, and the study's median pruner heard.

`TrialReport` is a hook between calls (train.hooks), made once by fit, on the chief, only when TUNE_TRIAL is set.
A pruned trial stops at the next call with a checkpoint, ends as a finished run (evaluated, exported), and its
summary.json says `"pruned": true`: the tune tells the study so from it.
"""

from __future__ import annotations

from collections.abc import Callable

import keras

from train.errors import SettingsError
from train.hooks import Hook, Metrics
from train.keras_seams import monitor_direction
from train.step import CallResult
from train.study import TrialRef

Say = Callable[[str], None]


class TrialReport(Hook):
    """Each epoch's objective reported to the trial (step: the epoch); stops the run where the pruner says so."""

    save_on_stop = True

    def __init__(self, ref: TrialRef, say: Say) -> None:
        self.ref, self.say = ref, say
        self.trial = ref.trial()
        self.pruned = False
        self.metrics: Metrics = {}  # the last call's training metrics

    def after_call(self, step: int, result: CallResult, skipped: int, examples_per_sec: float | None) -> None:
        self.metrics = result.metrics

    def epoch_end(self, epoch: int, step: int, metrics: Metrics) -> None:
        """The epoch's logs as epochs.json names them (train.callbacks): the training metrics, evaluation's val_."""
        logs = {**self.metrics, **{f"val_{name}": value for name, value in metrics.items()}}
        value = logs.get(self.ref.objective)
        if not isinstance(value, int | float):
            raise SettingsError(
                f"the tune's objective {self.ref.objective} is not among epoch {epoch}'s logs: "
                f"{', '.join(sorted(logs))}; set MONITOR to one of them"
            )
        self.trial.report(float(value), epoch)
        if self.ref.prune and self.trial.should_prune():
            self.pruned = True
            self.say(f"Trial {self.ref.number} pruned at epoch {epoch} ({self.ref.objective} {value:.6g}): "
                     "the median pruner stops it here.")  # fmt: skip

    def should_stop(self, step: int, saved_step: int, skipped: int) -> bool:
        return self.pruned

    def summary(self) -> dict[str, object]:
        """What summary.json says of the trial."""
        return {"trial": self.ref.number, "pruned": self.pruned}


def trial_report(network: keras.Model, monitor_mode: str, say: Say) -> TrialReport | None:
    """The hook of the trial TUNE_TRIAL names, None where the fit is not a trial. Raises SettingsError where the
    study's direction is not the one the engine resolves for its objective on this model (MONITOR_MODE=auto)."""
    ref = TrialRef.from_env()
    if ref is None:
        return None
    direction = monitor_mode if monitor_mode != "auto" else monitor_direction(network, ref.objective)
    wanted = {"minimize": "min", "maximize": "max"}[ref.direction]
    if direction is not None and direction != wanted:
        raise SettingsError(
            f"the tune {ref.direction}s {ref.objective}, which this model's metrics say should go {direction}: set "
            f"MONITOR_MODE={direction} for the tune, in another STUDY_DIR"
        )
    return TrialReport(ref, say)
