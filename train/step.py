"""The training step and evaluation, as `model.fit` and `model.evaluate` compute them, for any strategy.

A training call runs up to STEPS_PER_CALL steps under `strategy.run` in one `tf.function`. Each replica
computes `model.compute_loss` (the compiled loss, its `loss_weights` and the regularisation losses; Keras
losses already divide by the replica count), takes the gradients, and sums them over every replica and
worker itself before the optimizer sees them. So the optimizer's own options mean what they mean on one
device: clipping (`clipnorm`, `global_clipnorm`, `clipvalue`) clips the global gradient, and float16 loss
scaling judges "finite" on the global gradient, identical everywhere, so a step in which any replica
overflowed is skipped by all of them (Keras would judge each replica's local gradients: train.keras_seams).
Every compiled metric is updated as `model.fit` updates it and read under the names `model.evaluate(...,
return_dict=True)` gives.

The step's modules read the built model through `BuiltModel` (train.model.Built keeps it) and never import
train.model, nor it them: train.built makes the model, then asks train.custom_step to choose the step once.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol

import keras
import numpy as np
import tensorflow as tf

from train.accumulation import accumulating_replica_step
from train.data.examples import Inputs
from train.data.feeds import Feed, eval_dataset
from train.data.source import TrainSplit
from train.data.spec import DatasetSpec
from train.hooks import CallResult
from train.hooks import Metrics as MetricValues  # ... as JSON-ready numbers
from train.keras_seams import loss_tracker

Metrics = dict[str, tf.Tensor]  # compiled metrics (or a model's own step's logs) by name, as tensors


class BuiltModel(Protocol):
    """What a step reads of the built model (train.model.Built)."""

    @property
    def network(self) -> keras.Model: ...

    @property
    def serving(self) -> keras.Model: ...

    @property
    def spec(self) -> DatasetSpec: ...

    @property
    def optimizer(self) -> keras.optimizers.Optimizer: ...

    @property
    def loss_scaled(self) -> bool: ...

    @property
    def model_input(self) -> Callable[[Inputs], Inputs]: ...


def _all_reduce(gradients: list) -> list:
    """The sum over every replica of every worker; None (a variable the loss does not reach) stays None."""
    present = [gradient for gradient in gradients if gradient is not None]
    if not present:
        raise ValueError("the loss reaches none of the model's trainable variables")
    summed = iter(tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, present))
    return [None if gradient is None else next(summed) for gradient in gradients]


def _all_finite(gradients: list) -> tf.Tensor:
    values = [g.values if isinstance(g, tf.IndexedSlices) else g for g in gradients if g is not None]
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(value)) for value in values])


def _track_loss(built: BuiltModel, loss: tf.Tensor, labels: tf.Tensor) -> None:
    """The "loss" metric: this replica's mean (Keras's loss is it divided by the replicas), by its batch size."""
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    loss_tracker(built.network).update_state(loss * replicas, sample_weight=tf.shape(labels)[0])


def metric_values(results: Metrics) -> MetricValues:
    """Metric tensors as JSON-ready numbers: a scalar as a float, anything else as a (nested) list."""
    values: MetricValues = {}
    for name, value in results.items():
        array = np.asarray(value.numpy() if hasattr(value, "numpy") else value, dtype=np.float64)
        values[name] = float(array) if array.ndim == 0 else array.tolist()
    return values


@dataclass
class TrainCalls:
    """Runs training calls: `calls(steps)` trains that many steps on the feed's next batches.

    The one place where running out of device memory surfaces, for `fit` and `check` alike."""

    function: Callable[[tuple[tf.Tensor, ...], tf.Tensor], tuple[Metrics, tf.Tensor]]  # (call args, steps)
    feed: Feed
    global_batch: int
    accumulation: int = 1  # micro-batches a step accumulates: each replica takes global / replicas / this at once

    def __call__(self, steps: int) -> CallResult:
        results, skipped = self.function(self.feed.call_args(steps), tf.constant(steps, tf.int32))
        return CallResult(metric_values(results), int(skipped))


def make_train_calls(
    built: BuiltModel,
    strategy: tf.distribute.Strategy,
    feed: Feed,
    global_batch: int,
    jit_compile: bool,
    accumulation: int = 1,
) -> TrainCalls:
    """A tf.function running `steps` training steps under `strategy.run`, for any batch size, returning the
    metrics and the skips. The metrics are read inside the call: reading them eagerly after it cost more than
    a small model's step (docs/performance.md, Smaller choices). `accumulation` > 1: each replica takes its share
    of a step in that many micro-batches (train.accumulation); 1 leaves the step as it is.

    `jit_compile`: XLA compiles the whole call where the feed allows it (every input a tensor), else the
    replica step alone, as tensorflow/models does; the iterator's get_next stays outside XLA."""
    network, serving, optimizer = built.network, built.serving, built.optimizer
    variables = network.trainable_variables
    loss_scaled = built.loss_scaled

    def replica_step(*args):
        features, labels = feed.replica_batch(*args)
        with tf.GradientTape() as tape:
            predictions = serving(features, training=True)
            loss = network.compute_loss(x=features, y=labels, y_pred=predictions, training=True)
            scaled_loss = optimizer.scale_loss(loss)  # float16: times the loss scale; otherwise as it is
        gradients = _all_reduce(tape.gradient(scaled_loss, variables))
        optimizer.apply(gradients, variables)  # unscales, skips an overflowed step, clips, updates

        def update_metrics():
            _track_loss(built, loss, labels)
            network.compute_metrics(features, labels, predictions)

        if not loss_scaled:
            update_metrics()
            return tf.constant(True)
        finite = _all_finite(gradients)  # the same on every replica: the gradients are the global ones
        tf.cond(finite, update_metrics, lambda: None)  # an overflowed step counts in no metric
        return finite

    if accumulation > 1:
        replica_step = accumulating_replica_step(built, feed, accumulation, _all_reduce, _all_finite, _track_loss)
    whole_call = jit_compile and feed.compilable
    step_fn = (
        tf.function(replica_step, jit_compile=True, autograph=False) if jit_compile and not whole_call else replica_step
    )

    # autograph=False: the loop is written as the graph op it is; converting it and the step slowed every run's
    # first call (docs/performance.md, Smaller choices). Keras still converts each layer's `call`, so a model's
    # Python branches work.
    @tf.function(jit_compile=whole_call, autograph=False)
    def training_call(call_args, steps):
        def one_step(step, skipped):
            finite = strategy.run(step_fn, args=feed.step_args(call_args, step))
            finite = strategy.experimental_local_results(finite)[0]
            return step + 1, skipped + tf.cast(tf.logical_not(finite), tf.int32)

        # a while loop, not a loop over tf.range(steps): XLA would compile once per value of `steps`
        _, skipped = tf.while_loop(lambda step, _: step < steps, one_step, (tf.constant(0), tf.constant(0)))
        return network.get_metrics_result(), skipped

    return TrainCalls(training_call, feed, global_batch, accumulation)


class Evaluator:
    """Every compiled metric over a split, as `model.evaluate(..., return_dict=True)` reports it.

    `predict` is the model whose outputs are scored (the trained `serving` model, or a loaded export);
    `built.network` supplies the compiled loss and metrics. Runs on every replica of every worker together,
    each a share of every batch (see `eval_dataset`). It resets the metrics it shares with training.
    """

    _made: tuple[TrainSplit, int, tuple[tf.data.Dataset, int]] | None = None  # the last split's pipeline

    def __init__(self, built: BuiltModel, strategy: tf.distribute.Strategy, predict: keras.Model | None = None) -> None:
        self.built, self.strategy = built, strategy
        network, predict = built.network, predict or built.serving

        def replica_step(features, labels):
            predictions = predict(features, training=False)
            loss = network.compute_loss(x=features, y=labels, y_pred=predictions, training=False)
            _track_loss(built, loss, labels)
            network.compute_metrics(features, labels, predictions)

        @tf.function(autograph=False)
        def evaluate_steps(iterator, steps):
            def one_step(step):
                strategy.run(replica_step, args=next(iterator))
                return (step + 1,)

            tf.while_loop(lambda step: step < steps, one_step, (tf.constant(0),))
            return network.get_metrics_result()

        self._evaluate_steps = evaluate_steps

    def _dataset(self, split: TrainSplit, global_batch: int) -> tuple[tf.data.Dataset, int]:
        """The split's evaluation pipeline, made at its first evaluation and iterated afresh at each: every epoch
        would otherwise trace its functions again (about a tenth of a second each on this CPU)."""
        if self._made is None or self._made[0] is not split or self._made[1] != global_batch:
            self._made = (split, global_batch, eval_dataset(self.strategy, split, global_batch))
        return self._made[2]

    def __call__(self, split: TrainSplit, global_batch: int) -> MetricValues:
        self.built.network.reset_metrics()
        dataset, steps = self._dataset(split, global_batch)
        results = metric_values(self._evaluate_steps(iter(dataset), tf.constant(steps)))
        self.built.network.reset_metrics()
        return results
