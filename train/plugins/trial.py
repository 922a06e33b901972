"""A fit run as one of `tune`'s trials (TUNE_TRIAL set, train.plugins.study.TrialRef): each epoch's objective reported
to the trial, and the study's median pruner heard.

`TrialReport` is a hook (train.hooks), which the command line hands `fit` only when TUNE_TRIAL is set
(train.plugins.fit_hooks). A pruned trial stops at the next call with a checkpoint, ends as a finished run
(evaluated, exported), and its summary.json says `"pruned": true`: the tune tells the study so from it.
"""

from __future__ import annotations

from train.errors import SettingsError
from train.hooks import CallResult, Hook, Json, Metrics, RunInfo
from train.plugins.study import TrialRef


class TrialReport(Hook):
    """Each epoch's objective reported to the trial (step: the epoch); stops the run where the pruner says so."""

    save_on_stop = True

    def __init__(self, ref: TrialRef) -> None:
        self.ref, self.pruned = ref, False
        self.metrics: Metrics = {}  # the last call's training metrics

    def run_begin(self, run: RunInfo) -> Json:
        """The trial, opened once the model is built. Raises SettingsError where the study's direction is not the one
        the engine resolves for its objective on this model (MONITOR_MODE, or with auto Keras's rule)."""
        mode = run.settings["MONITOR_MODE"]
        direction = mode if mode != "auto" else run.direction(self.ref.objective)
        wanted = {"minimize": "min", "maximize": "max"}[self.ref.direction]
        if direction is not None and direction != wanted:
            raise SettingsError(
                f"the tune {self.ref.direction}s {self.ref.objective}, which this model's metrics say should go "
                f"{direction}: set MONITOR_MODE={direction} for the tune, in another STUDY_DIR"
            )
        self.trial, self.say = self.ref.trial(), run.say
        return {}

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
            self.say(
                f"Trial {self.ref.number} pruned at epoch {epoch} ({self.ref.objective} {value:.6g}): the median "
                "pruner stops it here."
            )

    def should_stop(self, step: int, saved_step: int, skipped: int) -> bool:
        return self.pruned

    def summary(self) -> Json:
        """What summary.json says of the trial."""
        return {"trial": self.ref.number, "pruned": self.pruned}
