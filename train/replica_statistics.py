"""The replicas' statistics: the non-trainable float state that layers update during training, averaged over
every replica and every worker; and SYNC_BATCH_NORM, Keras's synchronized batch moments.

Keras 3 makes BatchNormalization's `moving_mean` and `moving_variance` (and renorm's) with aggregation "none"
(keras PR #20703). TensorFlow then updates, on each replica, only that replica's copy: every replica and worker
keeps the statistics of its own share of every batch, and a save or an export takes replica 0's. tf_keras made them
ON_READ with MEAN, so that a read or a save averaged them. `averaging`'s call does what that read did: an
all-reduce MEAN under `strategy.run`, then an assign on each replica, before each checkpoint, each evaluation, the
export and the workers' final agreement check. Between those, the replicas' copies drift apart as in tf_keras.

Which variables: those a layer made with `trainable=False` and aggregation "none", of a float dtype, recorded when
the model is built. Not metric states nor the seed generators' integer states (which differ per replica on
purpose, train.model.spread_seeds), and not the weights frozen by setting a layer's `trainable` to False (the
optimizer never moves them: they are equal everywhere already).
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import tensorflow as tf

from train.keras_seams import all_layers, called_with_mask, made_non_trainable

Say = Callable[[str], None]


def replica_state(model: keras.Model) -> tuple[keras.Variable, ...]:
    """Every variable of `model` (nested layers included) that a layer made non-trainable, of a float dtype, with
    aggregation "none": what each replica updates alone."""
    found: dict[int, keras.Variable] = {}
    for layer in [model, *all_layers(model)]:
        for variable in made_non_trainable(layer):
            if variable.aggregation == "none" and keras.backend.is_float_dtype(variable.dtype):
                found.setdefault(id(variable), variable)
    return tuple(found.values())


def averaging(variables: tuple[keras.Variable, ...], strategy: tf.distribute.Strategy) -> Callable[[], None] | None:
    """The call that averages `variables` (`replica_state`) over every replica and worker; None on one replica or
    without them. Across workers it is a collective: every worker calls it at the same point, as it calls a
    checkpoint's save."""
    if not variables or strategy.num_replicas_in_sync == 1:
        return None
    values = [variable.value for variable in variables]  # the tf.Variables (MirroredVariables)

    def replica() -> None:
        context = tf.distribute.get_replica_context()
        means = context.all_reduce(tf.distribute.ReduceOp.MEAN, [tf.identity(value) for value in values])
        for value, mean in zip(values, means, strict=True):
            value.assign(mean)  # aggregation NONE in a replica's context: this replica's copy only

    @tf.function(autograph=False)
    def average() -> None:
        strategy.run(replica)

    return average


def synchronize_batch_norm(model: keras.Model, say: Say) -> None:
    """SYNC_BATCH_NORM=true: every BatchNormalization layer computes its batch moments over every replica's batch
    (`synchronized=True`, Keras's all-reduce of the moments, TensorFlow backend). A layer called with a mask takes
    Keras's masked moments, which are never synchronised: one warning line names each such layer."""
    for layer in all_layers(model):
        if not isinstance(layer, keras.layers.BatchNormalization):
            continue
        layer.synchronized = True  # read when the step is traced (BatchNormalization._moments)
        if called_with_mask(layer):
            say(
                f"warning: SYNC_BATCH_NORM=true: layer {layer.name!r} (BatchNormalization) is called with a mask, "
                "whose moments Keras does not synchronise: it normalises each replica's batch on its own."
            )
