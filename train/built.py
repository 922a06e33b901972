"""The model built and its step chosen, in that order, in one call: what every command that builds MODEL's model
calls (start, evaluate, predict, the tools).

train.model makes and checks the model and runs no step; train.custom_step chooses the step (the model's own
train_step, traced, or the engine's), every optimizer built either way. Both happen here, before the caller
restores a checkpoint: the restore needs the variables the trace makes and the optimizers' slots.
"""

from __future__ import annotations

from collections.abc import Callable

import tensorflow as tf

from train.context import Context
from train.custom_step import choose_step
from train.data.spec import DatasetSpec
from train.model import Built, make
from train.model_file import Experiment


def build(
    settings,  # train.settings.Settings, passed to make as it is
    experiment: Experiment,
    spec: DatasetSpec,
    strategy: tf.distribute.Strategy,
    context: Context | None = None,
    say: Callable[[str], None] | None = None,
) -> Built:
    """MODEL's model for this dataset, made and checked (train.model.make), then its step chosen inside the
    strategy's scope (train.custom_step.choose_step). The arguments are `make`'s. Raises SettingsError for a model
    that breaks the contract or a step that cannot run, before anything is written."""
    made = make(settings, experiment, spec, strategy, context, say)
    with strategy.scope():
        step = choose_step(made.experiment, made.network, strategy, made.batch, made.model_input, spec.labeled)
    return made.with_step(step, strategy)
