"""Phases: which layers train, and at what learning rate, epoch by epoch. No TensorFlow here.

A run is one phase (everything as build_model left it) unless FREEZE (with UNFREEZE_AT_EPOCH and
UNFREEZE_LEARNING_RATE) or MODEL's `phases(context, *, ...)` make it several:

    def phases(context, *, head_epochs=2):     # keyword-only parameters: HP_ settings, as build_model's
        return [Phase(head_epochs, trainable="head*"), Phase(3, trainable="all", learning_rate=1e-4)]

`Phase(epochs, trainable, learning_rate)`:
- `epochs` (int >= 1): how long it lasts. The phases follow each other; the last one lasts to the run's end
  however many epochs are left (so EPOCHS may change), and a phase that would begin after EPOCHS never does.
- `trainable`: "all" or None (every layer as build_model left it), or globs (one str, or a list or tuple of them)
  on layer paths (`layer.path`): a layer matched trains with its nested layers; every other layer is frozen
  (trainable=False: its BatchNormalization runs in inference mode). A layer build_model froze stays frozen.
- `learning_rate` (float > 0, or None: the optimizer's own): a constant rate is set to it; a
  LearningRateSchedule is scaled by learning_rate / LEARNING_RATE and goes on from the run's step.

FREEZE=backbone_* UNFREEZE_AT_EPOCH=3 is the common recipe as two phases: epochs 1-2 with backbone_* frozen at
the optimizer's own rate, then from epoch 3 everything at UNFREEZE_LEARNING_RATE (default LEARNING_RATE / 10).

`Phases` is the plan resolved on the built model (train.phased makes it): each phase's first epoch, the layer
paths that train in it and its rate, made once and passed down. Its steps come from the run's segment
(train.timeline): phase i begins at the step where epoch `first_epoch - 1` ends.
"""

from __future__ import annotations

import fnmatch
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from train.timeline import Segment

ALL = "all"


def in_model(model_path: str | None, path: str) -> str:
    """A layer's (or a variable's) path inside its model: `layer.path` without the model's own name in front, so
    that a Sequential's `sequential/head` is `head`, whatever the model was named. FREEZE, INIT_LAYERS and
    INIT_FROM's matching by layer name all read layers so."""
    return path.removeprefix(f"{model_path}/") if model_path else path


@dataclass(frozen=True)
class Phase:
    """One phase of a run, as MODEL's `phases()` returns them (see the module's docstring). Raises ValueError for
    a value out of its kind."""

    epochs: int
    trainable: tuple[str, ...] | None = None  # globs on layer paths; None ("all"): every layer as built
    learning_rate: float | None = None  # None: the optimizer's own

    def __post_init__(self) -> None:
        if type(self.epochs) is not int or self.epochs < 1:
            raise ValueError(f"epochs={self.epochs!r}: use a whole number of 1 or more")
        trainable = self.trainable
        if trainable is None or trainable == ALL:
            trainable = None
        elif isinstance(trainable, str):
            trainable = (trainable,)
        elif isinstance(trainable, Sequence) and trainable and all(isinstance(g, str) and g for g in trainable):
            trainable = tuple(trainable)
        else:
            raise ValueError(f"trainable={self.trainable!r}: use 'all' (or None), a glob, or a list of globs")
        object.__setattr__(self, "trainable", trainable)
        rate = self.learning_rate
        if rate is not None and (isinstance(rate, bool) or not isinstance(rate, int | float) or not 0 < rate < 1e30):
            raise ValueError(f"learning_rate={rate!r}: use a number greater than 0, or None (the optimizer's own)")
        object.__setattr__(self, "learning_rate", None if rate is None else float(rate))


def recipe(
    freeze: tuple[str, ...], unfreeze_at_epoch: int | None, unfreeze_learning_rate: float | None, learning_rate: float
) -> tuple[tuple[str, ...], list[Phase]]:
    """FREEZE, UNFREEZE_AT_EPOCH and UNFREEZE_LEARNING_RATE as phases: (the globs frozen in the first, the phases).
    The first phase's `trainable` is filled in by `resolve` (everything FREEZE does not match)."""
    first = Phase(unfreeze_at_epoch - 1 if unfreeze_at_epoch else 1)
    if unfreeze_at_epoch is None:
        return freeze, [first]
    rate = unfreeze_learning_rate if unfreeze_learning_rate is not None else learning_rate / 10
    return freeze, [first, Phase(1, None, rate)]


@dataclass(frozen=True)
class Layer:
    """A layer of the built model as the plan sees it: its path, its nested layers' paths, whether it holds
    weights itself, and whether build_model left it trainable."""

    path: str
    nested: tuple[str, ...]
    holds_weights: bool
    trainable: bool


@dataclass(frozen=True)
class PlannedPhase:
    first_epoch: int  # from 1
    trainable: frozenset[str]  # the paths of every layer that trains (containers included)
    learning_rate: float | None  # None: the optimizer's own

    def factor(self, learning_rate: float) -> float:
        """What a schedule is scaled by: this phase's rate / LEARNING_RATE (1 for the optimizer's own)."""
        return 1.0 if self.learning_rate is None else self.learning_rate / learning_rate


@dataclass(frozen=True)
class Phases:
    """The run's phases, resolved on the built model (`resolve`); `source` says where they come from."""

    phases: tuple[PlannedPhase, ...]
    layers: tuple[Layer, ...] = ()
    source: str = ""  # "FREEZE=..." or "phases() of MODEL=..."; "" for a run of one phase as built
    learning_rate: float = 0.001  # LEARNING_RATE: a schedule's rates are scaled relative to it

    @property
    def phased(self) -> bool:
        """Whether there is more than the one phase of everything as built (the checkpoint then records it)."""
        return bool(self.source)

    def index_at_epoch(self, epoch: int) -> int:
        """The phase of epoch `epoch` (from 1)."""
        return max(i for i, phase in enumerate(self.phases) if phase.first_epoch <= max(epoch, 1))

    def first_step(self, index: int, segment: Segment) -> int:
        """The step at which phase `index` begins on `segment`."""
        return segment.epoch_start(self.phases[index].first_epoch - 1) if index else 0

    def index_at(self, step: int, segment: Segment) -> int:
        """The phase of the step that begins at `step`."""
        return max(i for i in range(len(self.phases)) if self.first_step(i, segment) <= step)

    def next_change(self, step: int, segment: Segment) -> int | None:
        """The first step of the phase after the one of `step`, None for the last."""
        later = [self.first_step(i, segment) for i in range(len(self.phases)) if self.first_step(i, segment) > step]
        return min(later) if later else None

    def trainable_paths(self, index: int) -> list[str]:
        """The layers holding weights that train in phase `index`: what run.json and the start line name."""
        chosen = self.phases[index].trainable
        return [layer.path for layer in self.layers if layer.holds_weights and layer.path in chosen]

    def to_json(self, segment: Segment) -> list[dict[str, object]]:
        """run.json's and summary.json's "phases": for each, its first epoch and step, its trainable layer paths and
        its learning rate (null: the optimizer's own)."""
        return [
            {
                "first_epoch": phase.first_epoch,
                "first_step": self.first_step(i, segment),
                "trainable": self.trainable_paths(i),
                "learning_rate": phase.learning_rate,
            }
            for i, phase in enumerate(self.phases)
        ]

    def describe(self, index: int) -> str:
        """What phase `index` trains, for the start line and the line at a boundary."""
        phase = self.phases[index]
        frozen = [layer.path for layer in self.layers if layer.holds_weights and layer.path not in phase.trainable]
        own = phase.learning_rate is None
        rate = "the optimizer's own learning rate" if own else f"learning rate {phase.learning_rate:g}"
        what = f"{len(frozen)} layer(s) frozen ({_some(frozen)})" if frozen else "every layer trains"
        return f"phase {index} (of {len(self.phases)}, from epoch {phase.first_epoch}): {what}, {rate}"

    def same_as(self, recorded: object) -> bool:
        """Whether run.json's "phases" (a list as `to_json` wrote it) are these, their steps aside (a resume at another
        global batch maps the epochs to other steps)."""
        if not isinstance(recorded, list) or len(recorded) != len(self.phases):
            return False
        return all(
            isinstance(entry, dict)
            and (entry.get("first_epoch"), entry.get("trainable"), entry.get("learning_rate"))
            == (phase.first_epoch, self.trainable_paths(i), phase.learning_rate)
            for i, (entry, phase) in enumerate(zip(recorded, self.phases, strict=True))
        )


def _some(paths: list[str], most: int = 6) -> str:
    return ", ".join(paths[:most]) + (f", ... {len(paths) - most} more" if len(paths) > most else "")


def matched(globs: tuple[str, ...], layers: Sequence[Layer]) -> tuple[set[str], list[str]]:
    """(the paths of the layers the globs match, with their nested layers; the globs that match none)."""
    found: set[str] = set()
    unmatched = []
    for glob in globs:
        hits = [layer for layer in layers if fnmatch.fnmatchcase(layer.path, glob)]
        if not hits:
            unmatched.append(glob)
        for layer in hits:
            found.update((layer.path, *layer.nested))
    return found, unmatched


def resolve(
    layers: Sequence[Layer],
    specs: Sequence[Phase],
    frozen_first: tuple[str, ...] | None,
    source: str,
    learning_rate: float,
) -> tuple[Phases, str | None]:
    """The plan of `specs` on `layers` (`frozen_first`: FREEZE's globs, frozen in the first phase), or the problem:
    "glob 'x*' matches no layer; the layers are: ..."."""
    built = {layer.path for layer in layers if layer.trainable}
    containers = {layer.path: set(layer.nested) for layer in layers}
    weights = {layer.path for layer in layers if layer.holds_weights}
    planned, first_epoch = [], 1
    for index, spec in enumerate(specs):
        if index == 0 and frozen_first is not None:
            frozen, unmatched = matched(frozen_first, layers)
            chosen = built - frozen
        elif spec.trainable is None:
            chosen, unmatched = set(built), []
        else:
            chosen, unmatched = matched(spec.trainable, layers)
            chosen |= {path for path, nested in containers.items() if nested & chosen}  # their containers stay open
            chosen &= built
        if unmatched:
            names = _some([layer.path for layer in layers], 60)
            return Phases(()), f"{', '.join(map(repr, unmatched))} match(es) no layer; the layers are: {names}"
        if weights & built and not weights & chosen:  # its step would have no variable to update
            return Phases(()), (
                f"phase {index} (from epoch {first_epoch}) would train no layer: every layer holding "
                "weights is frozen in it; leave at least one out"
            )
        planned.append(PlannedPhase(first_epoch, frozenset(chosen), spec.learning_rate))
        first_epoch += spec.epochs
    return Phases(tuple(planned), tuple(layers), source, learning_rate), None
