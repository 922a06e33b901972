"""The run's phases (train.phases) on the built model: the plan made once, and each phase entered.

`make_phases` resolves FREEZE/UNFREEZE_* (or MODEL's `phases()`) on the built model's layer paths, before anything
is written: a glob that matches no layer is refused, naming the layers there are. `Phased` holds the plan, the
model and its optimizers, as they were built (before any restore): every optimizer is built on the full variable
list once, so the checkpoint's structure is the same in every phase (Keras 3 optimizers apply a subset).

Entering phase i (`Phased.enter`):
- every layer's `trainable` is set (a frozen layer's BatchNormalization runs in inference mode);
- the learning rate: a constant is set to the phase's (the compiled optimizer; another optimizer a model's own
  train_step applies is scaled by phase rate / LEARNING_RATE), a LearningRateSchedule scaled by that factor
  (`ScaledSchedule`) and going on from the optimizer's step;
- at the phase's first step (`fresh`), the optimizers' slots are zeroed, as a recompiled model's would be; their
  `iterations`, the model's metrics and the run's step go on. The rule holds wherever the run enters the phase
  at its first step: in one go, or resumed from a checkpoint saved exactly there (zeroing twice is zeroing once).

The training calls capture the trainable variables when they are traced: `PhaseCalls` makes them again at each
phase's first step (the loop ends a call there: train.loop).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

import keras
import tensorflow as tf

from train.context import Context
from train.errors import SettingsError, first_line
from train.hparams import taken_by
from train.keras_seams import (
    all_layers,
    held_optimizers,
    inner_optimizers,
    learning_rate_schedule,
    rate_is_callable,
    slots,
)
from train.model import Built
from train.model_file import PHASES_DOC, Experiment
from train.phases import Layer, Phase, Phases, in_model, recipe, resolve
from train.step import TrainCalls
from train.timeline import Segment

if TYPE_CHECKING:  # the settings' type only: make_phases reads FREEZE, UNFREEZE_*, LEARNING_RATE, MODEL, HP_
    from train.settings import Settings

Say = Callable[[str], None]


@keras.saving.register_keras_serializable(package="train")
class ScaledSchedule(keras.optimizers.schedules.LearningRateSchedule):
    """A schedule's rate times a phase's factor, at the optimizer's step (which goes on across phases)."""

    def __init__(self, schedule: keras.optimizers.schedules.LearningRateSchedule, factor: float) -> None:
        self.schedule, self.factor = schedule, float(factor)

    def __call__(self, step: tf.Tensor) -> tf.Tensor:
        return self.schedule(step) * self.factor

    def get_config(self) -> dict[str, object]:
        return {"schedule": keras.saving.serialize_keras_object(self.schedule), "factor": self.factor}

    @classmethod
    def from_config(cls, config: dict[str, object]) -> ScaledSchedule:
        return cls(keras.saving.deserialize_keras_object(config["schedule"]), config["factor"])


def _layers(network: keras.Model) -> list[tuple[keras.layers.Layer, str]]:
    """Every layer of the model with a path (not its Input), parents before their nested layers, with its path in
    the model: `layer.path` without the model's own name in front (a Sequential's layers are `sequential/head`)."""
    return [(layer, in_model(network.path, layer.path)) for layer in all_layers(network) if layer.path]


def layer_tree(network: keras.Model) -> tuple[Layer, ...]:
    """The model's layers as the plan sees them (train.phases.Layer)."""
    found = _layers(network)
    paths = {id(layer): path for layer, path in found}
    return tuple(
        Layer(
            path,
            tuple(paths[id(each)] for each in all_layers(layer) if id(each) in paths),
            bool(layer.weights) and not all_layers(layer),
            bool(layer.trainable),
        )
        for layer, path in found
    )


def _specs(
    settings: Settings, experiment: Experiment, context: Context | None
) -> tuple[list[Phase], tuple[str, ...] | None, str]:
    """The phases asked for: (the Phase list, FREEZE's globs or None, where they come from). Raises SettingsError."""
    if experiment.phases is not None and settings.freeze:
        raise SettingsError(
            f"FREEZE={','.join(settings.freeze)} is set, but MODEL={settings.model!r} defines phases(): each says "
            "which layers train when, so one of them would be ignored; unset FREEZE (and UNFREEZE_*), or remove "
            "phases()"
        )
    if settings.freeze:
        frozen, specs = recipe(
            settings.freeze, settings.unfreeze_at_epoch, settings.unfreeze_learning_rate, settings.learning_rate
        )
        source = f"FREEZE={','.join(settings.freeze)}" + (
            f", UNFREEZE_AT_EPOCH={settings.unfreeze_at_epoch}" if settings.unfreeze_at_epoch else ""
        )
        return specs, frozen, source
    if experiment.phases is None:
        return [Phase(1)], None, ""
    keywords = taken_by(experiment.phases, settings.hyperparameters)
    where = f"MODEL={settings.model!r}: phases"
    try:
        returned = experiment.phases(context, **keywords)
    except Exception as error:
        raise SettingsError(
            f"{where}(context, **{keywords}) raised {type(error).__name__}: {first_line(error, 200)}"
        ) from None
    if not isinstance(returned, list | tuple) or not returned or not all(isinstance(p, Phase) for p in returned):
        raise SettingsError(
            f"{where}() returned {str(returned)[:120]}: it must return a non-empty list of train.Phase(epochs, "
            f"trainable, learning_rate) (see {PHASES_DOC})"
        )
    return list(returned), None, f"phases() of MODEL={settings.model}"


def make_phases(settings: Settings, experiment: Experiment, built: Built, context: Context | None = None) -> Phased:
    """The run's phases on `built` (right after it is built, before any restore). Raises SettingsError for FREEZE
    with phases(), a phases() that fails or returns other than Phases, a glob that matches no layer."""
    specs, frozen, source = _specs(settings, experiment, context)
    plan, problem = resolve(layer_tree(built.network), specs, frozen, source, settings.learning_rate)
    if problem:
        what = f"FREEZE={','.join(settings.freeze)}" if frozen else f"MODEL={settings.model!r}: phases()"
        raise SettingsError(f"{what}: {problem}")
    return Phased(plan, built)


def _rate(optimizer: keras.optimizers.Optimizer) -> keras.optimizers.schedules.LearningRateSchedule | float:
    """The optimizer's rate as built: its schedule, or its constant. Raises SettingsError for a plain callable,
    which a phase could neither set nor scale."""
    schedule = learning_rate_schedule(optimizer)
    if schedule is not None:
        return schedule
    if rate_is_callable(optimizer):
        raise SettingsError(
            f"the optimizer {optimizer.name!r} has a plain callable as its learning_rate, which phases (FREEZE, "
            "phases()) can neither set nor scale: give it a float or a keras.optimizers.schedules.LearningRateSchedule"
        )
    return float(optimizer.learning_rate.numpy())


class Phased:
    """The plan and what it acts on: the model's layers and its optimizers, their rates as built."""

    def __init__(self, plan: Phases, built: Built) -> None:
        self.plan, self.network = plan, built.network
        compiled = [each for each in inner_optimizers(built.optimizer)]
        optimizers = [*compiled]
        for held in held_optimizers(built.network).values():
            optimizers += [each for each in inner_optimizers(held) if all(each is not o for o in optimizers)]
        self.optimizers = [each for each in optimizers if not isinstance(each, keras.optimizers.LossScaleOptimizer)]
        self.compiled = {id(each) for each in compiled}
        self.rates = [_rate(each) for each in self.optimizers] if plan.phased else []  # what each phase scales
        self.layers = _layers(built.network)
        self.built_trainable = [bool(layer.trainable) for layer, _ in self.layers]

    def enter(self, index: int, fresh: bool) -> None:
        """Phase `index`: the layers' trainable flags and the learning rate; `fresh`: its first step, the slots
        zeroed."""
        if not self.plan.phased:
            return
        phase = self.plan.phases[index]
        for (layer, path), trainable in zip(self.layers, self.built_trainable, strict=True):  # parents first
            layer.trainable = trainable and path in phase.trainable
        factor = phase.factor(self.plan.learning_rate)
        for optimizer, rate in zip(self.optimizers, self.rates, strict=True):
            if not isinstance(rate, float):
                optimizer.learning_rate = rate if factor == 1.0 else ScaledSchedule(rate, factor)
            elif id(optimizer) in self.compiled and phase.learning_rate is not None:
                optimizer.learning_rate = phase.learning_rate
            else:
                optimizer.learning_rate = rate * factor
            if fresh:
                for slot in slots(optimizer):
                    slot.assign(tf.zeros(slot.shape, slot.dtype))

    def rates_as_built(self) -> None:
        """The optimizers' rates as build_model made them (a schedule unscaled): what the export holds."""
        if not self.plan.phased:
            return
        for optimizer, rate in zip(self.optimizers, self.rates, strict=True):
            if not isinstance(rate, float):
                optimizer.learning_rate = rate


class PhaseCalls:
    """The training calls of the phase under way (train.loop's `Calls`): made again, the phase entered, at each
    phase's first step. `make` makes the calls; `record` puts the phase into the checkpoint."""

    def __init__(
        self,
        phased: Phased,
        segment: Segment,
        make: Callable[[], TrainCalls],
        global_batch: int,
        record: Callable[[int], None],
        say: Say,
    ) -> None:
        self.phased, self.segment, self.make, self.global_batch = phased, segment, make, global_batch
        self.record, self.say = record, say
        self.index: int | None = None
        self.calls: TrainCalls | None = None

    def at(self, step: int) -> TrainCalls:
        """The calls for the steps from `step` on (of one phase)."""
        plan = self.phased.plan
        index = plan.index_at(step, self.segment)
        if index != self.index or self.calls is None:
            fresh = step == plan.first_step(index, self.segment)
            self.phased.enter(index, fresh)
            self.record(index)
            if plan.phased:  # at the start, and at each boundary
                self.say(f"Step {step}: {plan.describe(index)}.")
            self.index, self.calls = index, self.make()
        return self.calls

    def next_change(self, step: int) -> int | None:
        return self.phased.plan.next_change(step, self.segment)
