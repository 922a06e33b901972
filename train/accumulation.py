"""Gradient accumulation: a step whose global batch is larger than the replicas take at once.

With GLOBAL_BATCH_SIZE and BATCH_SIZE (train.batches.batch_plan) each replica is handed its share of the
step's global batch as without accumulation, the same examples with the same seeds, and takes it here in
`accumulation` micro-batches, one after another in a loop inside the step: it sums their gradients, then the
step all-reduces once and applies the optimizer once, as train.step does for an unaccumulated step. So a step is
still one optimizer update: iterations, schedules, checkpoints and the data order count steps as before, and no
checkpoint falls inside a window (nothing of it outlives the step: the sums are the loop's own tensors, one copy of
the trainable variables per replica, in their dtype).

Each micro-batch's loss is divided by the accumulation, so the summed gradient is the mean over the share, as one
batch of it would give. Clipping and float16 loss scaling then act on the global accumulated gradient: an overflow
in any micro-batch of any replica makes it non-finite, and the whole step is skipped everywhere. The metrics are
updated for every micro-batch; a skipped step's updates are undone (the metrics' variables are put back).
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import tensorflow as tf

from train.errors import SettingsError
from train.keras_seams import all_layers
from train.model_file import Experiment

Batch = tuple[tf.Tensor | dict[str, tf.Tensor], tf.Tensor]  # (inputs, labels): the stored feature or preprocess's


def refuse_custom_train_step(model: str, network: keras.Model, accumulation: int) -> None:
    """Raises SettingsError where a step would accumulate but the model overrides `train_step` (the engine's step,
    not the fork's, is the one that accumulates)."""
    if accumulation > 1 and Experiment.own_train_step(network):
        raise SettingsError(
            f"MODEL={model!r} overrides train_step, and GLOBAL_BATCH_SIZE with BATCH_SIZE asks each step to "
            f"accumulate {accumulation} micro-batches, which only the engine's own step does: raise BATCH_SIZE to "
            "the global batch / the replicas, or leave GLOBAL_BATCH_SIZE unset"
        )


def _micro_batches(tensors: Batch, accumulation: int) -> Batch:
    """[share, ...] -> [accumulation, share / accumulation, ...]: micro-batch j, the share's j-th run of examples."""

    def split(tensor):
        return tf.reshape(tensor, [accumulation, -1, *tensor.shape[1:]])

    return tf.nest.map_structure(split, tensors)


def _dense(gradient):
    return tf.convert_to_tensor(gradient) if isinstance(gradient, tf.IndexedSlices) else gradient


def accumulating_replica_step(
    built, feed, accumulation: int, all_reduce: Callable, all_finite: Callable, track_loss: Callable
) -> Callable[..., tf.Tensor]:
    """The replica step of train.step.make_train_calls for `accumulation` > 1: the feed's share of the step in
    micro-batches, their gradients summed, one all-reduce and one optimizer update. Returns whether the step's
    gradients were finite (always True without loss scaling)."""
    network, serving, optimizer = built.network, built.serving, built.optimizer
    variables = network.trainable_variables
    loss_scaled = built.loss_scaled
    # SYNC_BATCH_NORM: each micro-batch's moments are all-reduced over the replicas (the micro-batch x the replicas)
    synchronized = any(getattr(layer, "synchronized", False) for layer in all_layers(serving))

    def replica_step(*args):
        features, labels = _micro_batches(feed.replica_batch(*args), accumulation)
        # under loss scaling, the metrics as they were: put back where the step overflows
        metric_variables = [v for metric in network.metrics for v in metric.variables] if loss_scaled else []
        before = [tf.identity(v) for v in metric_variables]
        reached: list[bool] = []  # which variables the loss reaches: known once the loop's body is traced

        def micro_step(index, sums):
            x, y = tf.nest.map_structure(lambda tensor: tensor[index], (features, labels))
            with tf.GradientTape() as tape:
                predictions = serving(x, training=True)
                loss = network.compute_loss(x=x, y=y, y_pred=predictions, training=True)
                scaled_loss = optimizer.scale_loss(loss / accumulation)  # the sum of the micro-batches: the mean
            gradients = tape.gradient(scaled_loss, variables)
            reached[:] = [gradient is not None for gradient in gradients]
            track_loss(built, loss, y)
            network.compute_metrics(x, y, predictions)
            summed = [total if g is None else total + _dense(g) for total, g in zip(sums, gradients, strict=True)]
            return index + 1, summed

        zeros = [tf.zeros_like(variable) for variable in variables]
        if synchronized:  # an all-reduce in a while loop's body is refused by tf.distribute (merge_call): unrolled
            sums = zeros
            for index in range(accumulation):
                _, sums = micro_step(tf.constant(index), sums)
        else:
            _, sums = tf.while_loop(
                lambda index, _: index < accumulation, micro_step, (tf.constant(0), zeros), parallel_iterations=1
            )
        gradients = all_reduce([total if kept else None for total, kept in zip(sums, reached, strict=True)])
        optimizer.apply(gradients, variables)  # unscales, skips an overflowed step, clips, updates
        if not loss_scaled:
            return tf.constant(True)
        finite = all_finite(gradients)  # the same on every replica: the global accumulated gradient

        def undo_metrics():  # an overflowed step counts in no metric, as without accumulation
            for variable, value in zip(metric_variables, before, strict=True):
                variable.assign(value)

        tf.cond(finite, lambda: None, undo_metrics)
        return finite

    return replica_step
