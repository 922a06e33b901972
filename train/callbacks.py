"""The fork's Keras callbacks (MODEL's `build_callbacks(context)`), MONITOR's best epoch, and each epoch's logs.

`Callbacks` is one of the loop's hooks (train.hooks); through it the callbacks are called as `model.fit` does:

    on_train_begin()                      once a start, before the first call (then the replay, below)
    on_epoch_begin(epoch)                 before an epoch's first call, and before the first call of a start
    on_train_batch_begin(batch)           before each call (up to STEPS_PER_CALL steps, as fit's
    on_train_batch_end(batch, logs)       steps_per_execution): batch is the epoch's index of its first / last
                                          step, logs the training metrics since the epoch began
    on_epoch_end(epoch, logs)             after the epoch's evaluation: the training metrics and evaluation's,
                                          prefixed val_, named as fit names them
    on_train_end(logs)                    once training ends, not when a signal stops it (it resumes)

Epochs count from 0, as in Keras; `callback.model` is the fork's model. `model.stop_training = True` ends the run
after the call, with a checkpoint. Across workers every worker runs its callbacks, and the chief's
`stop_training` is the one every worker follows.

Each epoch's logs go to OUTPUT_DIR/epochs.json. A restart replays them before training resumes: on_train_begin,
then on_epoch_begin and on_epoch_end with each recorded epoch's logs, up to the checkpoint it resumes from; then
that checkpoint is restored again, since what the replay changed in the model or the optimizer (a
ReduceLROnPlateau's reduction) is already in it. So EarlyStopping's and ReduceLROnPlateau's counters come back
as they were; what a callback built in the batch hooks, or read from the weights, does not (docs/design.md).

MONITOR picks the best epoch by its logs: the direction as Keras's mode="auto" tells it from the name (or
MONITOR_MODE), the best epoch's checkpoint kept whatever KEEP_CHECKPOINTS says (by the chief's role), and exported
at the end.

`Callbacks`, the hook, calls the callbacks and records the logs in the order above; `BestEpoch` follows MONITOR.
"""

from __future__ import annotations

import itertools
import json
import math
from collections.abc import Callable
from typing import ParamSpec, TypedDict, TypeVar

import keras
import tensorflow as tf

from train.checkpoints import RunCheckpoint
from train.cluster.role import Role
from train.cluster.workers import SingleHost
from train.context import Context
from train.errors import SettingsError, TrainingError, first_line
from train.hooks import MOMENTS, CallResult, Hook, Json, Metrics, Say
from train.keras_seams import monitor_direction
from train.model_file import OPTIONAL_SEAMS, Experiment
from train.rundir import EPOCHS
from train.timeline import Segment

T = TypeVar("T")
P = ParamSpec("P")
Logs = dict[str, object]  # an epoch's logs, as Keras's callbacks get them: metric names to numbers (or lists)


class Epoch(TypedDict):
    """One epoch's record in epochs.json."""

    epoch: int  # from 1
    step: int  # the step it ended at
    logs: Logs
    phase: int  # its phase (train.phases), 0 for a run of one phase


def _fork_list(experiment: Experiment, seam: str, kind: type[T], context: Context) -> list[T]:
    """MODEL's `seam(context)` (build_callbacks, build_hooks), checked: a list of `kind` ([] where the file has no
    such function). Raises SettingsError."""
    model, function = experiment.text, getattr(experiment, seam)
    if function is None:
        return []
    try:
        made = function(context)
    except Exception as error:
        raise SettingsError(
            f"MODEL={model!r}: {seam}(context) raised {type(error).__name__}: {first_line(error, 240)}"
        ) from None
    if not isinstance(made, list | tuple) or not all(isinstance(each, kind) for each in made):
        got = (
            type(made).__name__
            if not isinstance(made, list | tuple)
            else "a list holding "
            + ", ".join(sorted({type(each).__name__ for each in made if not isinstance(each, kind)}))
        )
        signature, example = OPTIONAL_SEAMS[seam]
        raise SettingsError(
            f"MODEL={model!r}: {seam} returned {got}: return {signature.split(' -> ')[1]} (see {example})"
        )
    return list(made)


def build_callbacks(experiment: Experiment, context: Context) -> list[keras.callbacks.Callback]:
    """The `experiment`'s (MODEL's file's) `build_callbacks(context)`, checked: a list of Keras callbacks ([]
    without one). Raises SettingsError."""
    return _fork_list(experiment, "build_callbacks", keras.callbacks.Callback, context)


def build_hooks(experiment: Experiment, context: Context) -> list[Hook]:
    """MODEL's `build_hooks(context)`, checked: its hooks (train.hooks), each moment guarded (`_guarded`). Raises
    SettingsError."""
    hooks = _fork_list(experiment, "build_hooks", Hook, context)
    for hook, moment in itertools.product(hooks, MOMENTS):
        setattr(hook, moment, _guarded(getattr(hook, moment), experiment.text, f"hook {type(hook).__name__}", moment))
    return hooks


def _guarded(call: Callable[P, T], model: str, what: str, moment: str) -> Callable[P, T]:
    """`call`, one of the moments of `what` (a hook or a callback of MODEL's): what it raises is the fork's code, not
    the engine's, told in one line naming MODEL, it and the moment (TrainingError: the last checkpoint is intact)."""

    def guarded(*args: P.args, **kwargs: P.kwargs) -> T:
        try:
            return call(*args, **kwargs)
        except Exception as error:
            raise TrainingError(
                f"MODEL={model!r}: its {what} raised {type(error).__name__} in {moment}: "
                f"{first_line(error, 240)}; the last checkpoint is intact"
            ) from None

    return guarded


def _better(value: object, best: object, direction: str) -> bool:
    """Strictly better, as Keras's monitors compare (a tie keeps the earlier epoch; NaN is never better)."""
    if not isinstance(value, int | float) or math.isnan(value):
        return False
    return not isinstance(best, int | float) or (value > best if direction == "max" else value < best)


class BestEpoch:
    """MONITOR's best epoch: judged at every epoch's end, its checkpoint kept out of KEEP_CHECKPOINTS' rotation
    (the chief's checkpoints keep it: train.cluster.workers), its weights evaluated and exported at the end."""

    def __init__(
        self,
        monitor: str | None,
        mode: str,
        network: keras.Model,
        peers: SingleHost,
        checkpoint: RunCheckpoint,
        say: Say,
    ) -> None:
        self.monitor, self.network, self.peers, self.checkpoint, self.say = monitor, network, peers, checkpoint, say
        self.direction: str | None = None if mode == "auto" else mode
        self.best: Epoch | None = None
        self.kept: int | None = None  # the step of the checkpoint kept out of the rotation for the best epoch

    def judge(self, entry: Epoch, replay: bool) -> None:
        """Epoch `entry` ended (or is replayed): is it the best yet? Raises SettingsError for a MONITOR it lacks."""
        if not self.monitor:
            return
        monitor, logs, epoch = self.monitor, entry["logs"], entry["epoch"]
        if monitor not in logs:
            raise SettingsError(
                f"MONITOR={monitor!r} is not among epoch {epoch}'s logs: {', '.join(sorted(logs))}; set MONITOR "
                f"to one of them (a val_ name is evaluation's), then run again to resume"
            )
        if not isinstance(logs[monitor], int | float):
            raise SettingsError(
                f"MONITOR={monitor!r} is a metric of several values ({logs[monitor]!r:.60}): name one "
                f"that is a single number, like {', '.join(sorted(n for n, v in logs.items() if isinstance(v, float)))}"
            )
        if self.direction is None:
            self.direction = monitor_direction(self.network, monitor)
            if self.direction is None:
                raise SettingsError(
                    f"MONITOR={monitor!r}: whether it should rise or fall cannot be told from its name (as "
                    "Keras's mode='auto' tells it): set MONITOR_MODE=max or min, then run again to resume"
                )
        best = self.best["logs"][monitor] if self.best else None
        # a replayed epoch is the best only where the chief still has its checkpoint
        held = not replay or self.checkpoint.manager.holds(entry["step"])
        if _better(logs[monitor], best, self.direction) and held:
            self.best = entry

    def agree(self, replayed: list[Epoch]) -> None:
        """After the replay: the chief's best, the one whose checkpoint it found, on every worker; kept out of the
        rotation (a kill right after its save left it in)."""
        if not self.monitor or not replayed:
            return
        best = self.peers.share_from_chief("callbacks/best", str(self.best["step"]) if self.best else "")
        self.best = next((entry for entry in replayed if str(entry["step"]) == best), None)
        if self.best:
            self.checkpoint.manager.keep_out_of_rotation(self.best["step"])
            self.kept = self.best["step"]

    def saved(self, step: int) -> None:
        """After the checkpoint of `step` was saved: the best epoch's is kept out of KEEP_CHECKPOINTS' rotation,
        and the one kept for the previous best is deleted."""
        if not self.best or self.best["step"] != step:
            return
        self.checkpoint.manager.keep_out_of_rotation(step)
        if self.kept is not None and self.kept != step:
            self.checkpoint.manager.drop_kept(self.kept)
        self.kept = step

    def use(self) -> None:
        """The best epoch's weights in place of the last step's (on every worker), to evaluate and export; the last
        checkpoint stays what a restart resumes from."""
        if not self.best:
            return
        prefix = self.checkpoint.directory / f"ckpt-{self.best['step']}"
        try:
            self.checkpoint.checkpoint.restore(str(prefix)).assert_existing_objects_matched()
        except (tf.errors.OpError, ValueError, AssertionError, IndexError) as error:  # (restore_newest's kinds)
            raise TrainingError(
                f"the best epoch's checkpoint {prefix} (MONITOR={self.monitor}) does not load "
                f"({first_line(error, 160)}); the last checkpoint {self.checkpoint.latest} is intact: "
                "run again to export"
            ) from None
        value = self.best["logs"][str(self.monitor)]
        self.say(
            f"MONITOR={self.monitor}: the best epoch is {self.best['epoch']} (step {self.best['step']}, {self.monitor} "
            f"{value:.4f}, {self.direction}); its weights are evaluated and exported, the last checkpoint resumes."
        )

    def summary(self) -> Json | None:
        if not self.best or not self.monitor:
            return None
        return {"epoch": self.best["epoch"], "step": self.best["step"], self.monitor: self.best["logs"][self.monitor]}


class Callbacks(Hook):
    """The callbacks, the epochs' logs and MONITOR's best epoch of one run: a hook between the loop's calls, which
    calls each job in the order `model.fit` does. Without callbacks and MONITOR it only records the logs, in
    epochs.json (the chief's writer writes it; a restart reads them back, the same on every worker). A callback's
    `model.stop_training` ends the run with a checkpoint (`save_on_stop`)."""

    save_on_stop = True

    def __init__(
        self,
        callbacks: list[keras.callbacks.Callback],
        network: keras.Model,
        epochs: int,
        steps_per_epoch: int,
        monitor: str | None,
        monitor_mode: str,
        role: Role,
        checkpoint: RunCheckpoint,
        say: Say,
        model: str,
        phase_of: Callable[[int], int] = lambda epoch: 0,
    ) -> None:
        self.callbacks, self.network, self.model = callbacks, network, model
        self.stopped_early = False  # by a callback's model.stop_training
        network.stop_training = False
        for callback in callbacks:
            callback.set_model(network)
            callback.set_params({"verbose": 0, "epochs": epochs, "steps": steps_per_epoch})
        self.writer, self.peers = role.writer, role.peers
        self.entries: list[Epoch] = []  # every epoch's logs: epochs.json
        self.best = BestEpoch(monitor, monitor_mode, network, role.peers, checkpoint, say)
        self.checkpoint, self.say, self.phase_of = checkpoint, say, phase_of
        self.metrics: Metrics = {}  # the last call's training metrics
        # The epoch under way (from 0, as Keras counts) and the step it began at: from the loop's epoch ends (and
        # the recorded ones), not from step arithmetic, since a start at another global batch re-bases the epochs.
        self.epoch, self.epoch_start, self.epoch_begun = 0, 0, False

    def _each(self, hook: str, *args: object) -> None:
        """`hook` (on_epoch_end, ...) of every callback, in the order MODEL's build_callbacks gave them. Raises
        TrainingError where one raises: the fork's code, not the engine's (the last checkpoint is intact)."""
        for callback in self.callbacks:
            _guarded(getattr(callback, hook), self.model, f"callback {type(callback).__name__}", hook)(*args)

    # --- a start: on_train_begin and the replay ---

    def begin(self, start_step: int, segment: Segment) -> None:
        """on_train_begin, then the recorded epochs up to `start_step` replayed, then the checkpoint restored again
        (after `train.resume.open_run_dir` restored it). `segment`: the run's mapping of steps to epochs."""
        recorded = self._recorded(start_step, segment, replayed=bool(self.callbacks or self.best.monitor))
        if recorded:
            self.epoch, self.epoch_start = recorded[-1]["epoch"], recorded[-1]["step"]
        else:  # a first start, or a run without its epochs.json: the run's own mapping of steps to epochs
            self.epoch = segment.epochs_completed(start_step)
            self.epoch_start = segment.epoch_start(self.epoch)
        self._each("on_train_begin", {})
        for entry in recorded:
            self._each("on_epoch_begin", entry["epoch"] - 1, {})
            self._epoch_end(entry, replay=True)
        if self.callbacks and recorded:
            self._restore_again(start_step)
        self.best.agree(self.entries)

    def _recorded(self, start_step: int, segment: Segment, replayed: bool) -> list[Epoch]:
        """The chief's epochs.json up to the step this start resumes from (an epoch logged but not saved is trained
        again), the same on every worker. `replayed`: whether anything replays them (callbacks or MONITOR)."""
        recorded = self.writer.recorded_epochs()
        done = segment.epochs_completed(start_step)  # the run's own epochs
        if recorded is None and done >= 1 and replayed:
            self.say(
                f"warning: {self.writer.output_dir / EPOCHS} is missing: the callbacks and MONITOR start afresh at "
                f"epoch {done + 1}; the epochs before it are not replayed."
            )
        text = json.dumps([entry for entry in recorded or [] if entry["step"] <= start_step])
        return json.loads(self.peers.share_from_chief("callbacks/epochs", text))

    def _restore_again(self, start_step: int) -> None:
        """What the replay changed in the model or optimizer was in the checkpoint already: it wins."""
        prefix = self.checkpoint.directory / f"ckpt-{start_step}"
        try:
            self.checkpoint.restore(prefix)
        except Exception as error:
            raise TrainingError(
                f"checkpoint {prefix} did not load again after the callbacks' replay ({first_line(error, 160)}); it "
                "is left as it is: run again to resume"
            ) from None

    # --- between calls ---

    def before_call(self, step: int) -> None:
        if not self.callbacks:
            return
        if not self.epoch_begun:  # an epoch's first call, or the first call of a start
            self.epoch_begun = True
            self._each("on_epoch_begin", self.epoch, {})
        self._each("on_train_batch_begin", step - self.epoch_start, {})

    def after_call(self, step: int, result: CallResult, skipped: int, examples_per_sec: float | None) -> None:
        self.metrics = result.metrics
        if self.callbacks:
            self._each("on_train_batch_end", step - 1 - self.epoch_start, dict(result.metrics))

    def should_stop(self, step: int, saved_step: int, skipped: int) -> bool:
        """Whether a callback set `model.stop_training` (the chief's, across workers)."""
        if not self.callbacks:
            return False
        stop = bool(getattr(self.network, "stop_training", False))
        if self.peers.workers > 1:
            stop = self.peers.share_from_chief(f"callbacks/stop_training/{step}", "1" if stop else "0") == "1"
            self.network.stop_training = stop
        self.stopped_early = self.stopped_early or stop
        return stop

    def epoch_end(self, epoch: int, step: int, metrics: Metrics) -> None:
        """After epoch `epoch` (from 1) was evaluated at `step`: on_epoch_end, MONITOR, epochs.json (the chief)."""
        logs: Logs = {**self.metrics, **{f"val_{name}": value for name, value in metrics.items()}}
        self._epoch_end(Epoch(epoch=epoch, step=step, logs=logs, phase=self.phase_of(epoch)), replay=False)
        self.epoch, self.epoch_start, self.epoch_begun = epoch, step, False
        self.writer.epochs(self.entries, self.checkpoint.latest)

    def _epoch_end(self, entry: Epoch, replay: bool) -> None:
        """on_epoch_end, then the logs recorded as the callbacks left them (what they add, like ReduceLROnPlateau's
        learning_rate, included); a replayed epoch keeps its record, whatever the callbacks write into theirs."""
        self._each("on_epoch_end", entry["epoch"] - 1, dict(entry["logs"]) if replay else entry["logs"])
        self.entries.append(entry)
        self.best.judge(entry, replay)

    def save(self, step: int, skipped: int) -> None:
        self.best.saved(step)

    def end(self, step: int) -> None:
        """on_train_end, with the last epoch's logs, once training ended at `step` (not by a signal)."""
        self._each("on_train_end", dict(self.entries[-1]["logs"]) if self.entries else {})
        if self.stopped_early:
            epoch = self.epoch + (step > self.epoch_start)  # from 1: the one it stopped in, or at the end of
            self.say(f"Stopped early at step {step} (epoch {epoch}): a callback set model.stop_training.")

    # --- the end ---

    def summary(self) -> Json:
        """What summary.json says of the callbacks and MONITOR."""
        return {"stopped_early": self.stopped_early, "best": self.best.summary()}
