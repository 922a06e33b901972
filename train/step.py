"""THE STEP: a training call of up to STEPS_PER_CALL steps under `strategy.run` in one `tf.function`, and evaluation,
as `model.fit` and `model.evaluate` compute them, for any strategy. Two functions, `make_calls(built, strategy, feed,
...)` and `make_evaluator(built, strategy)`, choose from what `train.model.build` found which step runs:

| step                       | a replica's step                                                                  |
|----------------------------|-----------------------------------------------------------------------------------|
| `EngineStep.gradients`     | `model.compute_loss` (the compiled loss, its `loss_weights`, the regularisation   |
|                            | losses), its gradients summed over every replica and worker, one optimizer update |
| `EngineStep.accumulated`   | the engine's step on its share in `n` micro-batches: their gradients summed, then |
|                            | one all-reduce and one update (GLOBAL_BATCH_SIZE with BATCH_SIZE)                 |
| the model's own train_step | `train_step(data)`, its logs the mean over the replicas, as Keras's               |
|                            | `make_train_function` runs it (traced, its optimizers built by train.model.build) |

The engine's step sums the gradients itself before the optimizer sees them (train.keras_seams.gradients_come_summed),
so the optimizer's options mean what they mean on one device: clipping (`clipnorm`, `global_clipnorm`, `clipvalue`)
clips the global gradient, and float16 loss scaling judges "finite" on the global gradient, identical everywhere: a
step in which any replica (or any micro-batch) overflowed is skipped by all of them, and counts in no metric. An
accumulated step is still one optimizer update: iterations, schedules, checkpoints and the data order count steps as
before; each micro-batch's loss is divided by `n`, so the summed gradient is the mean over the share. A model's own
train_step applies optimizers that sum the replicas' gradients themselves, inside `apply`, as Keras's do; it cannot
accumulate (`refuse_custom_train_step`). Every compiled metric is read under the names `model.evaluate(...,
return_dict=True)` gives; the metrics are read inside the call, which cost less than reading them eagerly after it
(docs/performance.md, Smaller choices).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

import keras
import numpy as np
import tensorflow as tf

from train.data.feeds import Feed, eval_dataset
from train.data.source import TrainSplit
from train.errors import SettingsError
from train.hooks import CallResult
from train.hooks import Metrics as MetricValues  # ... as JSON-ready numbers
from train.keras_seams import all_layers, loss_tracker
from train.model import Built, Logs, flatten_logs, mean_over_replicas
from train.model_file import Experiment

if TYPE_CHECKING:
    from train.batches import Batch
    from train.data.examples import Inputs
    from train.devices.runtime import Runtime

Metrics = dict[str, tf.Tensor]  # compiled metrics (or a model's own step's logs) by name, as tensors
Gradients = list[tf.Tensor | None]  # one per trainable variable; None: the loss does not reach it
Returned = tf.Tensor | Logs  # what a replica's step returns (whether it was finite, or train_step's logs), carried


def _all_reduce(gradients: Gradients) -> Gradients:
    """The sum over every replica of every worker; None (a variable the loss does not reach) stays None."""
    present = [gradient for gradient in gradients if gradient is not None]
    if not present:
        raise ValueError("the loss reaches none of the model's trainable variables")
    summed = iter(tf.distribute.get_replica_context().all_reduce(tf.distribute.ReduceOp.SUM, present))
    return [None if gradient is None else next(summed) for gradient in gradients]


def _all_finite(gradients: Gradients) -> tf.Tensor:
    values = [g.values if isinstance(g, tf.IndexedSlices) else g for g in gradients if g is not None]
    return tf.reduce_all([tf.reduce_all(tf.math.is_finite(value)) for value in values])


def _track_loss(network: keras.Model, loss: tf.Tensor, labels: tf.Tensor) -> None:
    """The "loss" metric: this replica's mean (Keras's loss is it divided by the replicas), by its batch size."""
    replicas = tf.distribute.get_strategy().num_replicas_in_sync
    loss_tracker(network).update_state(loss * replicas, sample_weight=tf.shape(labels)[0])


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
    accumulation: int = 1  # micro-batches a step takes on each replica, one after another

    def __call__(self, steps: int) -> CallResult:
        results, skipped = self.function(self.feed.call_args(steps), tf.constant(steps, tf.int32))
        return CallResult(metric_values(results), int(skipped))


def _training_call(
    strategy: tf.distribute.Strategy,
    feed: Feed,
    jit_compile: bool,
    replica_step: Callable[..., Returned],
    carry: Callable[[Returned, Returned], Returned],
    initial: Returned,
    result: Callable[[Returned], tuple[Metrics, tf.Tensor]],
) -> Callable[[tuple[tf.Tensor, ...], tf.Tensor], tuple[Metrics, tf.Tensor]]:
    """A tf.function running `steps` replica steps under `strategy.run` in a while loop: `carry(carried, what the
    replicas returned)` from `initial`, then `result(carried)`: (the metrics, the steps skipped).

    `jit_compile`: XLA compiles the whole call where the feed allows it (every input a tensor), else the replica
    step alone, as tensorflow/models does; the iterator's get_next stays outside XLA. autograph=False: the loop is
    written as the graph op it is; converting it and the step slowed every run's first call (docs/performance.md,
    Smaller choices). Keras still converts each layer's `call`, so a model's Python branches work."""
    whole_call = jit_compile and feed.compilable
    step_fn = (
        tf.function(replica_step, jit_compile=True, autograph=False) if jit_compile and not whole_call else replica_step
    )

    @tf.function(jit_compile=whole_call, autograph=False)
    def training_call(call_args: tuple[tf.Tensor, ...], steps: tf.Tensor) -> tuple[Metrics, tf.Tensor]:
        def one_step(step: tf.Tensor, carried: Returned) -> tuple[tf.Tensor, Returned]:
            returned = strategy.run(step_fn, args=feed.step_args(call_args, step))
            return step + 1, carry(carried, returned)

        # a while loop, not a loop over tf.range(steps): XLA would compile once per value of `steps`
        _, carried = tf.while_loop(lambda step, _: step < steps, one_step, (tf.constant(0), initial))
        return result(carried)

    return training_call


@dataclass(frozen=True)
class EngineStep:
    """The engine's own step on `built`: this replica's gradients, summed over every replica and worker, one
    update; with `n` > 1 micro-batches (`accumulated`), their gradients summed first."""

    built: Built
    n: int = 1

    def gradients(self, features: Inputs, labels: tf.Tensor, share: int = 1) -> Gradients:
        """This replica's gradients of the loss over (features, labels) divided by `share` (times the loss scale
        under float16), the metrics updated."""
        network, optimizer = self.built.network, self.built.optimizer
        with tf.GradientTape() as tape:
            predictions = self.built.serving(features, training=True)
            loss = network.compute_loss(x=features, y=labels, y_pred=predictions, training=True)
            scaled_loss = optimizer.scale_loss(loss / share if share > 1 else loss)  # float16: times the scale
        _track_loss(network, loss, labels)
        network.compute_metrics(features, labels, predictions)
        return tape.gradient(scaled_loss, network.trainable_variables)

    def accumulated(self, features: Inputs, labels: tf.Tensor) -> Gradients:
        """Each replica's share in `n` micro-batches, one after another in a loop inside the step, the same examples
        with the same seeds as without: the sum of their gradients (micro-batch j: the share's j-th run of
        examples), one copy of the trainable variables per replica, nothing outliving the step."""
        n, variables = self.n, self.built.network.trainable_variables
        split = tf.nest.map_structure(lambda t: tf.reshape(t, [n, -1, *t.shape[1:]]), (features, labels))
        reached: list[bool] = []  # which variables the loss reaches: known once the loop's body is traced

        def micro_step(index: tf.Tensor, sums: list[tf.Tensor]) -> tuple[tf.Tensor, list[tf.Tensor]]:
            x, y = tf.nest.map_structure(lambda tensor: tensor[index], split)
            gradients = self.gradients(x, y, share=n)
            reached[:] = [gradient is not None for gradient in gradients]
            dense = [tf.convert_to_tensor(g) if isinstance(g, tf.IndexedSlices) else g for g in gradients]
            return index + 1, [total if g is None else total + g for total, g in zip(sums, dense, strict=True)]

        sums = [tf.zeros_like(variable) for variable in variables]
        # SYNC_BATCH_NORM: each micro-batch's moments are all-reduced over the replicas, which tf.distribute refuses
        # inside a while loop's body (merge_call): the loop unrolled
        if any(getattr(layer, "synchronized", False) for layer in all_layers(self.built.serving)):
            for index in range(n):
                _, sums = micro_step(tf.constant(index), sums)
        else:
            _, sums = tf.while_loop(lambda i, _: i < n, micro_step, (tf.constant(0), sums), parallel_iterations=1)
        return [total if kept else None for total, kept in zip(sums, reached, strict=True)]

    def update(self, gradients: Callable[[], Gradients]) -> tf.Tensor:
        """`gradients()` all-reduced, then one optimizer update. Returns whether they were finite (always True
        without loss scaling); where they were not, the step is skipped and the metrics put back as they were."""
        network, optimizer = self.built.network, self.built.optimizer
        kept = [v for metric in network.metrics for v in metric.variables] if self.built.loss_scaled else []
        before = [tf.identity(variable) for variable in kept]
        summed = _all_reduce(gradients())
        optimizer.apply(summed, network.trainable_variables)  # unscales, skips an overflowed step, clips, updates
        if not self.built.loss_scaled:
            return tf.constant(True)
        finite = _all_finite(summed)  # the same on every replica: the gradients are the global ones

        def undo_metrics() -> None:  # an overflowed step counts in no metric
            for variable, value in zip(kept, before, strict=True):
                variable.assign(value)

        tf.cond(finite, lambda: None, undo_metrics)
        return finite


def make_calls(
    built: Built,
    strategy: tf.distribute.Strategy,
    feed: Feed,
    global_batch: int,
    jit_compile: bool,
    accumulation: int = 1,
) -> TrainCalls:
    """The training calls of `built`'s step (see the module's table): the model's own train_step where it has one
    (its logs reduced over the replicas as `model.fit` reduces them and flattened as it flattens them, no skips),
    else the engine's, in `accumulation` micro-batches where > 1 (refused for a model's own step before:
    `refuse_custom_train_step`). Every caller that trains goes through here, so an overridden train_step is never
    bypassed."""
    if built.step.own:

        def own_step(*args: tf.Tensor) -> Returned:
            return built.network.train_step(built.step_data(*feed.replica_batch(*args)))

        empty = tf.nest.map_structure(lambda spec: tf.zeros(spec.shape, spec.dtype), built.step.logs_spec)
        call = _training_call(
            strategy,
            feed,
            jit_compile,
            own_step,
            lambda _, logs: mean_over_replicas(strategy, logs),
            empty,
            lambda logs: (flatten_logs(logs), tf.constant(0)),
        )
        return TrainCalls(call, feed, global_batch)
    step = EngineStep(built, accumulation)
    gradients = step.accumulated if accumulation > 1 else step.gradients

    def replica_step(*args: tf.Tensor) -> tf.Tensor:
        features, labels = feed.replica_batch(*args)
        return step.update(lambda: gradients(features, labels))

    def count_skips(skipped: tf.Tensor, finite: Returned) -> tf.Tensor:
        finite = strategy.experimental_local_results(finite)[0]
        return skipped + tf.cast(tf.logical_not(finite), tf.int32)

    call = _training_call(
        strategy,
        feed,
        jit_compile,
        replica_step,
        count_skips,
        tf.constant(0),
        lambda skipped: (built.network.get_metrics_result(), skipped),
    )
    return TrainCalls(call, feed, global_batch, accumulation)


def make_evaluator(built: Built, strategy: tf.distribute.Strategy, predict: keras.Model | None = None) -> Evaluate:
    """Evaluation's step for `built`: the model's own test_step, none (its own train_step, no loss, no test_step),
    or the engine's; `predict`: a loaded export to score instead of the trained weights. Raises SettingsError for an
    export a model's own test_step cannot score."""
    if built.step.own_test_step:
        try:  # evaluate --exported: the export's weights, scored by the model's own test_step
            if predict is not None:
                built.serving.set_weights(predict.get_weights())
        except ValueError:
            raise SettingsError(
                f"evaluate --exported: {predict.name!r} in model.keras is not the model that trained (MODEL's "
                "export_model replaced it), so its test_step cannot score it: evaluate the checkpoint (without "
                "--exported)"
            ) from None
        return Evaluator(built, strategy, own_test_step=True)
    if not built.step.evaluates:
        return NoEvaluation(built)
    return Evaluator(built, strategy, predict)


class Evaluator:
    """Every compiled metric over a split, as `model.evaluate(..., return_dict=True)` reports it; or a model's own
    `test_step` (`own_test_step`), as `model.evaluate` runs it: the last step's logs, reduced over the replicas, a
    value named as one of the model's metrics being the metric's result over the whole split.

    `predict` is the model whose outputs are scored (the trained `serving` model, or a loaded export);
    `built.network` supplies the compiled loss and metrics. Runs on every replica of every worker together,
    each a share of every batch (see `eval_dataset`). It resets the metrics it shares with training.
    """

    _made: tuple[TrainSplit, int, tuple[tf.data.Dataset, int]] | None = None  # the last split's pipeline

    def __init__(
        self,
        built: Built,
        strategy: tf.distribute.Strategy,
        predict: keras.Model | None = None,
        own_test_step: bool = False,
    ) -> None:
        self.built, self.strategy = built, strategy
        network, predict = built.network, predict or built.serving

        def replica_step(features: Inputs, labels: tf.Tensor) -> Returned | None:
            if own_test_step:
                return network.test_step(built.step_data(features, labels))
            predictions = predict(features, training=False)
            loss = network.compute_loss(x=features, y=labels, y_pred=predictions, training=False)
            _track_loss(network, loss, labels)
            network.compute_metrics(features, labels, predictions)
            return None

        @tf.function(autograph=False)
        def evaluate_steps(iterator: tf.distribute.DistributedIterator, steps: tf.Tensor) -> Metrics:
            def one_step(step: tf.Tensor) -> tuple[tf.Tensor]:
                strategy.run(replica_step, args=next(iterator))
                return (step + 1,)

            # a model's own test_step: every step but the last in the loop; the last outside it, for its logs
            tf.while_loop(lambda step: step < steps - int(own_test_step), one_step, (tf.constant(0),))
            if not own_test_step:
                return network.get_metrics_result()
            logs = flatten_logs(mean_over_replicas(strategy, strategy.run(replica_step, args=next(iterator))))
            whole = network.get_metrics_result()
            return {name: whole.get(name, value) for name, value in logs.items()}

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


class NoEvaluation:
    """A model with its own train_step, no test_step and no loss it compiled: nothing to score, so nothing is
    evaluated (summary.json's "eval" is {}). The metrics it shares with training still restart at each epoch."""

    def __init__(self, built: Built) -> None:
        self.built = built

    def __call__(self, split: TrainSplit, global_batch: int) -> MetricValues:
        self.built.network.reset_metrics()
        return {}


Evaluate = Evaluator | NoEvaluation  # each called as evaluate(split, global_batch) -> the metrics' values


def refuse_custom_train_step(model: str, network: keras.Model, accumulation: int) -> None:
    """Raises SettingsError where a step would take micro-batches but the model overrides `train_step` (the
    engine's step, not the fork's, is the one that can)."""
    if accumulation > 1 and Experiment.own_train_step(network):
        raise SettingsError(
            f"MODEL={model!r} overrides train_step, and GLOBAL_BATCH_SIZE with BATCH_SIZE asks each step to "
            f"accumulate {accumulation} micro-batches, which only the engine's own step does: raise BATCH_SIZE to "
            "the global batch / the replicas, or leave GLOBAL_BATCH_SIZE unset"
        )


def refuse_unevaluated_monitor(monitor: str | None, model_setting: str, built: Built) -> None:
    """MONITOR on an evaluation metric (val_...) of a model that is not evaluated. Raises SettingsError."""
    step = built.step
    if not monitor or not monitor.startswith("val_") or step.evaluates:
        return
    names = ", ".join(sorted(flatten_logs(step.logs_spec)))
    raise SettingsError(
        f"MONITOR={monitor!r} names an evaluation metric, but MODEL={model_setting!r} is not evaluated (its own "
        f"train_step has no test_step beside it): monitor one of its training logs ({names}), or define test_step"
    )


def smaller_micro_batch(runtime: Runtime) -> int | None:
    """AUTO_BATCH under GLOBAL_BATCH_SIZE: the next smaller divisor of each replica's share of the global batch
    (so the global batch, and with it the data order, stays), None where the micro-batch is 1 already."""
    share = runtime.per_replica_batch * runtime.accumulation
    smaller = [d for d in range(1, runtime.per_replica_batch) if share % d == 0]
    return smaller[-1] if smaller else None


def describe_batch(batch: Batch, runtime: Runtime) -> str:
    """The start line's batch: the global batch, what a replica takes at once, how many micro-batches a step
    accumulates and why, and where BATCH_SIZE and GLOBAL_BATCH_SIZE came from."""
    per, replicas, accumulation = runtime.per_replica_batch, runtime.replicas, runtime.accumulation
    if accumulation > 1:
        text = f"global batch {runtime.global_batch} = micro-batch {per} x {accumulation} accumulated x {replicas}"
    else:
        text = f"global batch {runtime.global_batch} = {per} per replica x {replicas}"
    if batch.global_size is None or batch.size is None:
        return text
    sources = dict(batch.sources)
    share = runtime.global_batch // replicas
    where = (
        f"GLOBAL_BATCH_SIZE={batch.global_size} from {sources.get('GLOBAL_BATCH_SIZE', 'the settings')}, "
        f"BATCH_SIZE={batch.size} from {sources.get('BATCH_SIZE', 'the settings')}"
    )
    if accumulation == 1:
        return f"{text} ({where}: {share} a replica, no accumulation)"
    return f"{text} ({where}: {share} a replica, at most {batch.size} at once)"


def accumulation_changed(last_start: Mapping[str, object], runtime: Runtime) -> str:
    """What the start line adds where a resume keeps the global batch but accumulates otherwise than before."""
    before = last_start.get("accumulation", 1)
    return (
        f"The global batch stays {runtime.global_batch} (GLOBAL_BATCH_SIZE): the last start ran "
        f"{last_start.get('replicas')} replica(s) accumulating {before}, this one {runtime.replicas} accumulating "
        f"{runtime.accumulation} micro-batch(es) of {runtime.per_replica_batch} a step; the data order and EPOCHS "
        "are kept."
    )
