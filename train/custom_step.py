"""A fork's own `train_step` and `test_step`, run as Keras's TensorFlow trainer runs them, on any strategy; and the
step chosen once: the engine's (train.step) or the model's own, behind `TrainCalls`.

Keras's `make_train_function` calls `model.train_step(data)` on every replica under `strategy.run` and reduces
the dict it returns with `reduce_per_replica(..., "auto")`: the mean over the replicas. This does the same, up
to STEPS_PER_CALL steps in one `tf.function` as the engine's own step (train.step), fed by the same feeds.
`data` is `(inputs, labels)` as the model gets them: what `preprocess` returns, or the stored feature after
the engine's scaling of an image; with LABEL_KEY=none the inputs alone, as Keras's `fit(x)` gives them (`step_data`).
A model without `call()` (the keras.io DCGAN) is built by tracing its step once: it is never called.

The optimizers such a step applies sum the replicas' gradients themselves, inside `apply`, as Keras's do: the
engine turns that sum off only for its own step (train.keras_seams.gradients_come_summed), never here. So
their options act as Keras applies them: clipping clips each replica's gradients before the sum.

| concern                             | where                                                              |
|-------------------------------------|--------------------------------------------------------------------|
| is the step the model's own         | `Experiment.own_train_step`, `own_test_step` (train.model_file)    |
| what no step can run                | `refuse_step`, `refuse_unrunnable` (train.model_file)              |
| the step, chosen once (train.built) | `choose_step`: an `EngineStep` or an `OwnStep` (its step traced,   |
|                                     | its optimizers built before a restore: `prepare_custom_step`)      |
| the training call                   | `make_calls` (the chosen step's `calls`), `make_custom_train_calls`|
| evaluation                          | `make_evaluator` (the chosen step's `evaluator`), `CustomEvaluator`|
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import ClassVar, Protocol

import keras
import tensorflow as tf

from train.data.examples import Inputs, InputSpec
from train.data.feeds import Feed
from train.data.source import TrainSplit
from train.errors import SettingsError, first_line
from train.keras_seams import gradients_come_summed
from train.model_file import Experiment
from train.step import BuiltModel, Evaluator, Metrics, MetricValues, TrainCalls, make_train_calls

Logs = dict[str, "tf.Tensor | Logs"]  # what a train_step or test_step returns: nested dicts of tensors
LogsSpec = dict[str, "tf.TensorSpec | LogsSpec"]  # ... their structure
StepData = Inputs | tuple[Inputs, tf.Tensor]  # what train_step(data) gets: (inputs, labels), or the inputs alone


def step_data(inputs: Inputs, labels: tf.Tensor, labeled: bool) -> StepData:
    """What train_step and test_step get: (inputs, labels), or the inputs alone (LABEL_KEY=none)."""
    return (inputs, labels) if labeled else inputs


def flatten_logs(logs: Logs) -> Metrics:
    """A step's logs as `model.fit` reports them: a nested dict's entries in place of it, under their own names."""
    flat: Metrics = {}
    for name, value in sorted(logs.items()):
        if isinstance(value, dict):
            flat.update(flatten_logs(value))
        else:
            flat[name] = value
    return flat


def _mean_over_replicas(strategy: tf.distribute.Strategy, logs: Logs) -> Logs:
    """`reduce_per_replica(..., "auto")`: the mean over every replica of every worker (a number that is not a
    float: the first replica's)."""

    def reduce(value):
        first = strategy.experimental_local_results(value)[0]
        if tf.as_dtype(first.dtype).is_floating:
            return strategy.reduce(tf.distribute.ReduceOp.MEAN, value, axis=None)
        return first

    return tf.nest.map_structure(reduce, logs)


def _check_logs(model_setting: str, logs: object) -> None:
    """The step's return: a dict (nested dicts allowed) of numbers of a fixed shape. Raises SettingsError."""
    problem = None
    if not isinstance(logs, dict):
        problem = "returned a tensor" if isinstance(logs, tf.Tensor) else f"returned {type(logs).__name__}"
    elif not flatten_logs(logs):
        problem = "returned an empty dict (nothing to log)"
    else:
        for name, value in flatten_logs(logs).items():
            if not isinstance(value, tf.Tensor) or value.dtype == tf.string or not value.shape.is_fully_defined():
                problem = f"returned {name!r} = {value!r:.80}"
                break
    if problem:
        raise SettingsError(
            f"MODEL={model_setting!r}: train_step {problem}: it must return a dict of scalars, like "
            "{m.name: m.result() for m in self.metrics}"
        )


def prepare_custom_step(
    model_setting: str,
    network: keras.Model,
    strategy: tf.distribute.Strategy,
    batch: tuple[InputSpec, tf.TensorSpec],
    model_input: Callable[[Inputs], Inputs],
    labeled: bool = True,
) -> OwnStep:
    """Trace `network.train_step` once on `batch` (tf.TensorSpecs of the inputs and labels as stored) under
    `strategy.run`, without running it, and build every optimizer it applies on the variables it applies it to,
    so a checkpoint restores into them. Raises SettingsError for a step that fails, returns other than a dict of
    scalars, or leaves an optimizer the model holds unbuilt. A model without call() is built by that trace."""
    logs, applied = _trace(model_setting, network, strategy, model_input, batch, labeled)
    if not network.built:  # a subclass without call(), never called: its variables are its layers', now made
        network.built = True
    with strategy.scope():  # eagerly, in cross-replica context: a replica's variable could not be lifted out
        for optimizer, variables in applied.values():
            if not optimizer.built:
                optimizer.build(variables)
    _check_logs(model_setting, logs)
    _refuse_unbuilt(model_setting, network)
    own_test_step = Experiment.own_test_step(network)
    evaluates = own_test_step or network.loss is not None
    return OwnStep(tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), logs), evaluates, own_test_step)


def _trace(
    model_setting: str,
    network: keras.Model,
    strategy: tf.distribute.Strategy,
    model_input: Callable[[Inputs], Inputs],
    batch: tuple[InputSpec, tf.TensorSpec],
    labeled: bool,
) -> tuple[Logs, dict[int, tuple[keras.optimizers.Optimizer, list[keras.Variable]]]]:
    """What train_step returns, traced (not run) on `batch`, and each optimizer the model holds with the variables
    the step applies it to (by id). Their `apply` is stood in for while tracing: an optimizer built inside a
    replica's context would take the first replica's initial value, unliftable from the trace."""
    applied: dict[int, tuple[keras.optimizers.Optimizer, list[keras.Variable]]] = {}
    optimizers = list(held_optimizers(network).values())

    def recorder(optimizer):
        def apply(grads, trainable_variables=None):
            if trainable_variables is not None and id(optimizer) not in applied:
                applied[id(optimizer)] = (optimizer, list(trainable_variables))

        return apply

    @tf.function(autograph=False)  # as Keras's one_step_on_data: do_not_convert
    def one_step(batch):
        inputs, targets = batch
        step = strategy.run(network.train_step, args=(step_data(model_input(inputs), targets, labeled),))
        return _mean_over_replicas(strategy, step)

    for optimizer in optimizers:
        optimizer.apply = recorder(optimizer)  # an instance attribute: apply_gradients calls it too
    try:
        logs = one_step.get_concrete_function(batch).structured_outputs
    except Exception as error:
        given = "inputs and labels as the model gets them" if labeled else "the inputs alone: LABEL_KEY=none"
        hint = "; for a step that takes the inputs alone (a GAN's), set LABEL_KEY=none" if labeled else ""
        raise SettingsError(
            f"MODEL={model_setting!r}: its train_step failed on a batch of the data's spec ({given}): "
            f"{type(error).__name__}: {first_line(error, 240)}{hint}"
        ) from None
    finally:
        for optimizer in optimizers:
            del optimizer.apply
    return logs, applied


def held_optimizers(network: keras.Model) -> dict[str, keras.optimizers.Optimizer]:
    """Every optimizer the model holds as an attribute (or in a list or dict of them), by attribute name."""
    found: dict[str, keras.optimizers.Optimizer] = {}
    for name, value in vars(network).items():
        if name.startswith("_"):  # Keras's and TensorFlow's own bookkeeping (the compiled one is `optimizer`)
            continue
        values = value.values() if isinstance(value, dict) else value if isinstance(value, list | tuple) else [value]
        for each in values:
            if isinstance(each, keras.optimizers.Optimizer) and all(each is not o for o in found.values()):
                found[name] = each
    return found


def _refuse_unbuilt(model_setting: str, network: keras.Model) -> None:
    for name, optimizer in held_optimizers(network).items():
        if optimizer is network.optimizer:  # the compiled one: the engine builds it on the model's variables
            continue
        if not optimizer.built:
            raise SettingsError(
                f"MODEL={model_setting!r}: the model's optimizer {name!r} is still unbuilt after tracing train_step "
                "once (it is applied under a condition, or never), so a checkpoint cannot restore it: build it in "
                f"build_model, e.g. model.{name}.build(<the variables it updates>)"
            )


def make_custom_train_calls(
    built: BuiltModel,
    strategy: tf.distribute.Strategy,
    feed: Feed,
    global_batch: int,
    jit_compile: bool,
    logs_spec: LogsSpec,
) -> TrainCalls:
    """A tf.function running `steps` calls of the model's `train_step` under `strategy.run`, returning the
    last step's logs (of `logs_spec`'s structure), reduced over the replicas as `model.fit` reduces them and
    flattened as it flattens them (and no skips: a model's own step applies its optimizers as it likes).

    `jit_compile`: XLA compiles the whole call where the feed allows it, else the replica step alone."""
    network, model_input, labeled = built.network, built.model_input, built.spec.labeled

    def replica_step(*args):
        features, labels = feed.replica_batch(*args)
        return network.train_step(step_data(model_input(features), labels, labeled))

    whole_call = jit_compile and feed.compilable
    step_fn = (
        tf.function(replica_step, jit_compile=True, autograph=False) if jit_compile and not whole_call else replica_step
    )
    empty = tf.nest.map_structure(lambda spec: tf.zeros(spec.shape, spec.dtype), logs_spec)

    @tf.function(jit_compile=whole_call, autograph=False)
    def training_call(call_args, steps):
        def one_step(step, _):
            logs = strategy.run(step_fn, args=feed.step_args(call_args, step))
            return step + 1, _mean_over_replicas(strategy, logs)

        _, logs = tf.while_loop(lambda step, _: step < steps, one_step, (tf.constant(0), empty))
        return flatten_logs(logs), tf.constant(0)

    return TrainCalls(training_call, feed, global_batch)


class CustomEvaluator(Evaluator):
    """A model's own `test_step` over a split (whatever its train_step), on every replica of every worker, as
    `model.evaluate` runs it: the last step's logs, reduced over the replicas; a value named as one of the
    model's metrics is the metric's result over the whole split (every replica's share summed, as the engine's
    own evaluation reads it)."""

    def __init__(self, built: BuiltModel, strategy: tf.distribute.Strategy) -> None:
        self.built, self.strategy = built, strategy
        network, model_input, labeled = built.network, built.model_input, built.spec.labeled

        def replica_step(features, labels):
            return network.test_step(step_data(model_input(features), labels, labeled))

        @tf.function(autograph=False)
        def evaluate_steps(iterator, steps):
            def one_step(step):
                strategy.run(replica_step, args=next(iterator))
                return (step + 1,)

            # every step but the last in the loop; the last outside it, for its logs (of any structure)
            tf.while_loop(lambda step: step < steps - 1, one_step, (tf.constant(0),))
            logs = flatten_logs(_mean_over_replicas(strategy, strategy.run(replica_step, args=next(iterator))))
            whole = network.get_metrics_result()
            return {name: whole.get(name, value) for name, value in logs.items()}

        self._evaluate_steps = evaluate_steps  # Evaluator.__call__ runs it over the split


class NoEvaluation:
    """A model with its own train_step, no test_step and no loss it compiled: nothing to score, so nothing is evaluated
    (summary.json's "eval" is {}). The metrics it shares with training still restart at each epoch."""

    def __init__(self, built: BuiltModel) -> None:
        self.built = built

    def __call__(self, split: TrainSplit, global_batch: int) -> MetricValues:
        self.built.network.reset_metrics()
        return {}


Evaluate = Evaluator | NoEvaluation  # each called as evaluate(split, global_batch) -> the metrics' values


def _take_weights(built: BuiltModel, exported: keras.Model) -> None:
    """The exported model's weights into the model that trained. Raises SettingsError where they do not fit."""
    try:
        built.serving.set_weights(exported.get_weights())
    except ValueError:
        raise SettingsError(
            f"evaluate --exported: {exported.name!r} in model.keras is not the model that trained (MODEL's "
            "export_model replaced it), so its test_step cannot score it: evaluate the checkpoint (without --exported)"
        ) from None


def _own_test_evaluator(built: BuiltModel, strategy: tf.distribute.Strategy, predict: keras.Model | None) -> Evaluate:
    if predict is not None:  # evaluate --exported: the export's weights, scored by the model's own test_step
        _take_weights(built, predict)
    return CustomEvaluator(built, strategy)


@dataclass(frozen=True)
class EngineStep:
    """The engine's own step (train.step): it accumulates micro-batches, sums the global gradient itself, and
    evaluates with the compiled loss and metrics, or with the model's own test_step where it has one."""

    own_test_step: bool
    own: ClassVar[bool] = False  # the model's own train_step is not the step
    accumulates: ClassVar[bool] = True
    evaluates: ClassVar[bool] = True

    def calls(
        self,
        built: BuiltModel,
        strategy: tf.distribute.Strategy,
        feed: Feed,
        global_batch: int,
        jit_compile: bool,
        accumulation: int = 1,
    ) -> TrainCalls:
        return make_train_calls(built, strategy, feed, global_batch, jit_compile, accumulation)

    def evaluator(self, built: BuiltModel, strategy: tf.distribute.Strategy, predict: keras.Model | None) -> Evaluate:
        if self.own_test_step:
            return _own_test_evaluator(built, strategy, predict)
        return Evaluator(built, strategy, predict)


@dataclass(frozen=True)
class OwnStep:
    """The model's own train_step, traced once (`prepare_custom_step`): the logs it returns (`logs_spec`, their
    structure), and whether evaluation has a step to run (its own test_step, or a loss it compiled). It cannot
    accumulate micro-batches (train.accumulation refuses it)."""

    logs_spec: LogsSpec
    evaluates: bool
    own_test_step: bool = False
    own: ClassVar[bool] = True
    accumulates: ClassVar[bool] = False

    def calls(
        self,
        built: BuiltModel,
        strategy: tf.distribute.Strategy,
        feed: Feed,
        global_batch: int,
        jit_compile: bool,
        accumulation: int = 1,
    ) -> TrainCalls:
        return make_custom_train_calls(built, strategy, feed, global_batch, jit_compile, self.logs_spec)

    def evaluator(self, built: BuiltModel, strategy: tf.distribute.Strategy, predict: keras.Model | None) -> Evaluate:
        if self.own_test_step:
            return _own_test_evaluator(built, strategy, predict)
        if not self.evaluates:
            return NoEvaluation(built)
        return Evaluator(built, strategy, predict)


Step = EngineStep | OwnStep


def choose_step(
    experiment: Experiment,
    network: keras.Model,
    strategy: tf.distribute.Strategy,
    batch: tuple[InputSpec, tf.TensorSpec],
    model_input: Callable[[Inputs], Inputs],
    labeled: bool,
) -> Step:
    """The step, chosen once (train.built.build, inside the strategy's scope): the model's own train_step where it
    has one, traced on `batch` (`prepare_custom_step`), else the engine's; every optimizer built either way, so a
    checkpoint restores into it. Raises SettingsError as `prepare_custom_step` does."""
    if experiment.own_train_step(network):
        step: Step = prepare_custom_step(experiment.text, network, strategy, batch, model_input, labeled)
    else:
        step = EngineStep(experiment.own_test_step(network))
    if not network.optimizer.built:  # (the symbolic build builds it too) now, so a checkpoint restores into it
        network.optimizer.build(network.trainable_variables)
    if not step.own:  # a model's own step applies optimizers that sum the replicas' gradients themselves
        gradients_come_summed(network.optimizer)
    return step


class StepOwner(BuiltModel, Protocol):
    """A built model with its step chosen (train.model.Built, as train.built.build returns it)."""

    @property
    def step(self) -> Step: ...


def make_calls(
    built: StepOwner,
    strategy: tf.distribute.Strategy,
    feed: Feed,
    global_batch: int,
    jit_compile: bool,
    accumulation: int = 1,
) -> TrainCalls:
    """The training calls of `built`'s step (`choose_step` chose it once): the model's own `train_step` where it has
    one, else the engine's step (accumulating `accumulation` micro-batches a step: train.accumulation refuses it for
    a model's own step). Every caller that trains goes through here, so an overridden train_step is never bypassed."""
    return built.step.calls(built, strategy, feed, global_batch, jit_compile, accumulation)


def make_evaluator(built: StepOwner, strategy: tf.distribute.Strategy, predict: keras.Model | None = None) -> Evaluate:
    """Evaluation's step for `built`: its own test_step, none (no loss, no test_step), or the engine's; `predict`:
    a loaded export to score instead of `built`'s weights. Raises SettingsError for an export it cannot score."""
    return built.step.evaluator(built, strategy, predict)


def refuse_unevaluated_monitor(monitor: str | None, model_setting: str, built: StepOwner) -> None:
    """MONITOR on an evaluation metric (val_...) of a model that is not evaluated. Raises SettingsError."""
    step = built.step
    if not monitor or not monitor.startswith("val_") or step.evaluates:
        return
    names = ", ".join(sorted(flatten_logs(step.logs_spec)))
    raise SettingsError(
        f"MONITOR={monitor!r} names an evaluation metric, but MODEL={model_setting!r} is not evaluated (its own "
        f"train_step has no test_step beside it): monitor one of its training logs ({names}), or define test_step"
    )
