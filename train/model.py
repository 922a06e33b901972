"""MODEL in: the fork's compiled model, checked against the data, its own step traced: what every command builds.

The contract a model file keeps is one function, `build_model(input_shape, num_classes, learning_rate)`,
returning a compiled `keras.Model` (examples/mlp.py says it in full); its keyword-only parameters get the
hyperparameters' values (train.hparams) and, one named `context`, the run's facts (train.context). Around it
the engine puts what the data needs and the export must carry: an `Input` of the feature's stored shape and
dtype, named after the feature, then, for a TFDS image, the scaling of uint8 to [0, 1]. That composed model
(`Built.serving`) is what trains, what evaluates and what `model.keras` and `saved_model/` hold, so the export
serves exactly what was evaluated.

A model's own `train_step` is traced once, not run (`StepFacts`), and every optimizer built, before any caller
restores a checkpoint, which needs the variables the trace makes and the optimizers' slots. train.step runs steps.
"""

from __future__ import annotations

import hashlib
import inspect
from collections.abc import Callable
from dataclasses import dataclass

import keras
import numpy as np
import tensorflow as tf

from train.context import Context
from train.data.examples import Inputs, InputSpec
from train.data.spec import DatasetSpec
from train.errors import SettingsError, first_line
from train.hparams import CONTEXT, taken_by
from train.keras_seams import (
    all_layers,
    build_metrics_and_loss,
    compiled,
    gradients_come_summed,
    held_optimizers,
    inner_optimizers,
)
from train.model_file import Experiment, overrides, refuse_step
from train.outputs import check_output, label_words, output_shape
from train.replica_statistics import averaging, replica_state, synchronize_batch_norm
from train.settings import Settings

SymbolicInputs = keras.KerasTensor | dict[str, keras.KerasTensor]
Logs = dict[str, "tf.Tensor | Logs"]  # what a train_step or test_step returns: nested dicts of tensors
LogsSpec = dict[str, "tf.TensorSpec | LogsSpec"]  # ... their structure
StepData = Inputs | tuple[Inputs, tf.Tensor]  # what train_step(data) gets: (inputs, labels), or the inputs alone
Optimizers = dict[int, tuple[keras.optimizers.Optimizer, list[keras.Variable]]]  # by id: each, what it applies to

# A replica's random stream is the seed's, moved by this much per replica id: replicas and workers draw
# different numbers (Dropout masks, augmentations), each reproducible from SEED.
REPLICA_SEED_STRIDE = 1_000_003
CONVOLUTIONS = (
    keras.layers.Conv1D,
    keras.layers.Conv2D,
    keras.layers.Conv3D,
    keras.layers.Conv1DTranspose,
    keras.layers.Conv2DTranspose,
    keras.layers.Conv3DTranspose,
    keras.layers.DepthwiseConv1D,
    keras.layers.DepthwiseConv2D,
    keras.layers.SeparableConv1D,
    keras.layers.SeparableConv2D,
)


@dataclass(frozen=True)
class StepFacts:
    """What the step will be (train.step.make_calls and make_evaluator choose from these): the model's own
    train_step (`own`, its traced logs' structure `logs_spec`) or the engine's; its own test_step; whether
    evaluation has a step to run (the engine's always, an own train_step's where it has a test_step or
    compiled a loss)."""

    own: bool
    own_test_step: bool
    evaluates: bool = True
    logs_spec: LogsSpec | None = None

    @property
    def accumulates(self) -> bool:
        """Whether a step can take micro-batches: the engine's can, a model's own train_step cannot."""
        return not self.own


@dataclass(frozen=True)
class Built:
    """The fork's compiled model (`network`: its loss, metrics, optimizer) and the model that trains and is
    exported (`serving`: input, scaling, then `network`); `seeds`: every random layer's state; `statistics`: the
    state each replica updates alone (BatchNormalization's moving statistics), averaged by `average_statistics`."""

    network: keras.Model
    serving: keras.Model
    spec: DatasetSpec
    seeds: tuple[tf.Variable, ...]
    experiment: Experiment  # MODEL's file, loaded once: export_model and the layers preprocess uses
    step: StepFacts  # the engine's step or the model's own, found once by `build`
    statistics: Callable[[], None] | None = None  # train.replica_statistics.averaging's call

    @property
    def custom_step(self) -> StepFacts | None:
        """The model's own train_step where it is the step, else None."""
        return self.step if self.step.own else None

    def average_statistics(self) -> None:
        """Every replica's and worker's copy of the replica state made their mean (a collective across workers):
        before each checkpoint, each evaluation, the export and the workers' final agreement check."""
        if self.statistics is not None:
            self.statistics()

    def step_data(self, inputs: Inputs, labels: tf.Tensor) -> StepData:
        """What train_step and test_step get: (inputs as `network` gets them, labels), or the inputs alone."""
        return _step_data(_model_input(self.serving, self.spec), self.spec.labeled, inputs, labels)

    @property
    def optimizer(self) -> keras.optimizers.Optimizer:
        return self.network.optimizer

    @property
    def loss_scaled(self) -> bool:
        """Whether float16 loss scaling is on (Keras wraps the optimizer under mixed_float16)."""
        return isinstance(self.optimizer, keras.optimizers.LossScaleOptimizer)

    @property
    def loss_scale(self) -> float | None:
        return float(self.optimizer.dynamic_scale.numpy()) if self.loss_scaled else None

    @property
    def convolutional(self) -> bool:
        return any(isinstance(layer, CONVOLUTIONS) for layer in all_layers(self.serving))

    def layer_without_xla(self) -> str | None:
        """The first layer that says XLA cannot compile it (`supports_jit = False`), by name and class."""
        for layer in all_layers(self.serving):
            if not getattr(layer, "supports_jit", True):
                return f"{layer.name} ({type(layer).__name__})"
        return None


def _step_data(model_input: Callable[[Inputs], Inputs], labeled: bool, inputs: Inputs, labels: tf.Tensor) -> StepData:
    return (model_input(inputs), labels) if labeled else model_input(inputs)


def wants_context(settings: Settings, build: Callable[..., keras.Model]) -> bool:
    """Whether build_model declares `context` (keyword-only). Raises SettingsError for one it cannot be given as."""
    try:
        parameter = inspect.signature(build).parameters.get(CONTEXT)
    except (TypeError, ValueError):  # no signature to read (a builtin, a C function)
        return False
    if parameter is None or parameter.kind is inspect.Parameter.VAR_KEYWORD:
        return False
    if parameter.kind is not inspect.Parameter.KEYWORD_ONLY:
        raise SettingsError(
            f"MODEL={settings.model!r}: build_model's {CONTEXT} is not keyword-only: declare it after a `*`, like "
            f"build_model(input_shape, num_classes, learning_rate, *, {CONTEXT})"
        )
    return True


def _call_build_model(
    settings: Settings, experiment: Experiment, spec: DatasetSpec, context: Context | None
) -> keras.Model:
    build = experiment.build_model
    keywords: dict[str, object] = taken_by(build, settings.hyperparameters)
    given = "".join(f", {name}={value!r}" for name, value in keywords.items())
    arguments = f"({spec.input_shape}, {spec.num_classes}, {settings.learning_rate}{given})"
    if wants_context(settings, build):
        if context is None:
            raise SettingsError(f"MODEL={settings.model!r}: build_model declares {CONTEXT}, which this command lacks")
        keywords[CONTEXT] = context
    try:
        network = build(spec.input_shape, spec.num_classes, settings.learning_rate, **keywords)
    except Exception as error:
        unlabeled = "" if spec.labeled else " (LABEL_KEY=none: no labels, so num_classes is None)"
        raise SettingsError(
            f"MODEL={settings.model!r}: build_model{arguments} raised {type(error).__name__}: "
            f"{first_line(error, 240)}{unlabeled}"
        ) from None
    if not isinstance(network, keras.Model):
        raise SettingsError(
            f"MODEL={settings.model!r}: build_model returned {type(network).__name__}, not a keras.Model"
        )
    if not network.compiled or network.optimizer is None:
        raise SettingsError(
            f"MODEL={settings.model!r}: build_model returned a model that is not compiled: call "
            "model.compile(optimizer=..., loss=..., metrics=[...]) before returning it"
        )
    _check_input_names(settings, spec, network)
    return network


def _check_input_names(settings: Settings, spec: DatasetSpec, network: keras.Model) -> None:
    """A dict of inputs (preprocess's, or the columns) keyed as the model's keras.Inputs are named."""
    if not isinstance(spec.inputs, dict):
        return
    try:
        names = {tensor.name for tensor in network.inputs}
    except (AttributeError, ValueError, TypeError):  # a subclassed model: no Inputs to name
        return
    given = set(spec.inputs)
    if names != given:
        source = "preprocess returns" if spec.examples.preprocess else f"FEATURE_KEY={spec.feature_key!r} has"
        raise SettingsError(
            f"MODEL={settings.model!r}: {source} inputs {sorted(given)} but the model's keras.Input names are "
            f"{sorted(names)}: name each Input after its key"
        )


def _check_optimizer(settings: Settings, optimizer: keras.optimizers.Optimizer) -> None:
    """Refuse the optimizer options that would not mean on N replicas what they mean on one."""
    for each in inner_optimizers(optimizer):
        if getattr(each, "gradient_accumulation_steps", None):
            raise SettingsError(
                f"MODEL={settings.model!r} compiles with gradient_accumulation_steps="
                f"{each.gradient_accumulation_steps}, which Keras cannot run inside a distributed training loop: "
                "set GLOBAL_BATCH_SIZE (the global batch) with BATCH_SIZE (what one replica takes at once) instead: "
                "the engine then accumulates micro-batches itself"
            )
        if getattr(each, "use_ema", False) and getattr(each, "ema_overwrite_frequency", None):
            raise SettingsError(
                f"MODEL={settings.model!r} compiles with use_ema and ema_overwrite_frequency="
                f"{each.ema_overwrite_frequency}, which Keras cannot run inside a distributed training loop: "
                "keep use_ema and leave ema_overwrite_frequency unset (the template evaluates and exports "
                "the averaged weights)"
            )


def _spec_batch(spec: DatasetSpec, model_input: bool) -> tuple[SymbolicInputs, keras.KerasTensor]:
    """A symbolic batch of the dataset: as stored, or (`model_input`) as the network gets it, after scaling."""
    labels = keras.KerasTensor((None, *spec.label_shape), spec.label_dtype)
    if spec.inputs is not None:  # the general path: what preprocess (or the columns) gives
        return tf.nest.map_structure(lambda s: keras.KerasTensor((None, *s.shape), s.dtype.name), spec.inputs), labels
    dtype = "float32" if model_input and spec.scale else spec.feature_dtype
    return keras.KerasTensor((None, *spec.feature_shape), dtype), labels


def _serving_model(settings: Settings, network: keras.Model, spec: DatasetSpec) -> keras.Model:
    """The model that trains and is exported: on the general path the fork's own (it gets what preprocess
    returns, exactly); else an Input of the stored feature, named after it, and an image's scaling, in front.
    Raises SettingsError for a model that cannot be called on its input (a subclass without `call`)."""
    if not spec.as_stored:
        return network
    inputs = keras.Input(shape=spec.feature_shape, dtype=spec.feature_dtype, name=spec.feature_key)
    features = keras.layers.Rescaling(spec.scale, name="scale_to_unit_range")(inputs) if spec.scale else inputs
    try:
        outputs = network(features)
    except NotImplementedError:
        raise SettingsError(
            f"MODEL={settings.model!r}: {type(network).__name__} cannot be called on its input (it defines no "
            "call()): define call(inputs), what the model computes when served (a GAN: its discriminator's score)"
        ) from None
    except (ValueError, TypeError) as error:  # an Input of another shape or dtype than build_model was given
        raise SettingsError(
            f"MODEL={settings.model!r}: {type(network).__name__} cannot be called on {spec.name}'s "
            f"{spec.feature_key} {list(spec.feature_shape)} {spec.feature_dtype} ({first_line(error, 240)}): build it "
            "on build_model's input_shape"
        ) from None
    return keras.Model(inputs, outputs, name=f"{network.name}_serving")


def build(
    settings: Settings,
    experiment: Experiment,
    spec: DatasetSpec,
    strategy: tf.distribute.Strategy,
    context: Context | None = None,
    say: Callable[[str], None] | None = None,
) -> Built:
    """MODEL's model for this dataset, made inside the strategy's scope and checked, its own train_step traced and
    every optimizer built (`_own_step`), each replica given its random stream: what every command that builds the
    model calls, before it restores a checkpoint. `context`: the run's facts, for a build_model that declares it
    (train.context.run_context). `say`: where SYNC_BATCH_NORM's warnings go (None: nowhere, for the commands that
    do not train). `experiment`: MODEL's file, loaded once by the command and passed down.

    Raises SettingsError for a model that breaks the contract or a step that cannot run, before anything is
    written."""
    keras.utils.set_random_seed(settings.seed)
    with strategy.scope():
        network = _call_build_model(settings, experiment, spec, context)
        if settings.sync_batch_norm:
            synchronize_batch_norm(network, say or (lambda line: None))
        refuse_step(experiment, network, settings.mixed_precision, spec.labeled)
        own = experiment.own_train_step(network)
        _check_optimizer(settings, network.optimizer)
        # a model that is its own step needs no call(): built by tracing that step, exported by export_model
        serving = network if own and not overrides(network, "call") else _serving_model(settings, network, spec)
        if own:  # no label check (a GAN's step need not use the labels, nor a loss)
            step = _own_step(experiment.text, network, strategy, _model_input(serving, spec), spec)
        else:
            _check_engine_step_model(settings, network, serving, spec)
            step = StepFacts(False, experiment.own_test_step(network))
        if not network.optimizer.built:  # (the symbolic build builds it too) now, so a checkpoint restores into it
            network.optimizer.build(network.trainable_variables)
        if not own:  # a model's own step applies optimizers that sum the replicas' gradients themselves
            gradients_come_summed(network.optimizer)
    # the random layers' state, taken after the step's trace (which may make layers)
    weights = {id(variable) for variable in serving.weights}
    seeds = tuple(variable.value for variable in serving.variables if id(variable) not in weights)
    statistics = averaging(replica_state(serving), strategy)
    built = Built(network, serving, spec, seeds, experiment, step, statistics)
    spread_seeds(built, strategy)
    return built


def flatten_logs(logs: Logs) -> dict[str, tf.Tensor]:
    """A step's logs as `model.fit` reports them: a nested dict's entries in place of it, under their own names."""
    flat: dict[str, tf.Tensor] = {}
    for name, value in sorted(logs.items()):
        if isinstance(value, dict):
            flat.update(flatten_logs(value))
        else:
            flat[name] = value
    return flat


def mean_over_replicas(strategy: tf.distribute.Strategy, logs: Logs) -> Logs:
    """`reduce_per_replica(..., "auto")`: the mean over every replica of every worker (a number that is not a
    float: the first replica's)."""

    def reduce(value: tf.Tensor) -> tf.Tensor:
        first = strategy.experimental_local_results(value)[0]
        if tf.as_dtype(first.dtype).is_floating:
            return strategy.reduce(tf.distribute.ReduceOp.MEAN, value, axis=None)
        return first

    return tf.nest.map_structure(reduce, logs)


def _own_step(
    model_setting: str,
    network: keras.Model,
    strategy: tf.distribute.Strategy,
    model_input: Callable[[Inputs], Inputs],
    spec: DatasetSpec,
) -> StepFacts:
    """What it compiled (a loss, metrics) built as `model.fit` builds them; `network.train_step` traced once on a
    batch of the data as stored under `strategy.run`, not run; every optimizer it applies built on the variables it
    applies it to, so a checkpoint restores into them. Raises SettingsError for a compiled loss or metric that does
    not build, a step that fails, returns other than a dict of scalars, or leaves an optimizer the model holds
    unbuilt. A model without call() is built by that trace."""
    what = " and ".join(compiled(network))  # a GAN compiles neither: nothing to build
    if what:
        where = "cannot be built on the data's spec (as model.fit builds them)"
        _build_on_spec(network, spec, f"MODEL={model_setting!r}: its compiled {what} {where}")
    logs, applied = _trace(model_setting, network, strategy, model_input, spec.labeled, _stored_batch(spec))
    if not network.built:  # a subclass without call(), never called: its variables are its layers', now made
        network.built = True
    with strategy.scope():  # eagerly, in cross-replica context: a replica's variable could not be lifted out
        for optimizer, variables in applied.values():
            if not optimizer.built:
                optimizer.build(variables)
    problem = _logs_problem(logs)
    if problem:
        raise SettingsError(
            f"MODEL={model_setting!r}: train_step {problem}: it must return a dict of scalars, like "
            "{m.name: m.result() for m in self.metrics}"
        )
    for name, optimizer in held_optimizers(network).items():  # the compiled one: built on the model's variables
        if optimizer is not network.optimizer and not optimizer.built:
            raise SettingsError(
                f"MODEL={model_setting!r}: the model's optimizer {name!r} is still unbuilt after tracing train_step "
                "once (it is applied under a condition, or never), so a checkpoint cannot restore it: build it in "
                f"build_model, e.g. model.{name}.build(<the variables it updates>)"
            )
    own_test_step = Experiment.own_test_step(network)
    logs_spec = tf.nest.map_structure(lambda t: tf.TensorSpec(t.shape, t.dtype), logs)
    return StepFacts(True, own_test_step, own_test_step or network.loss is not None, logs_spec)


def _logs_problem(logs: Logs | tf.Tensor) -> str | None:
    """What is wrong with a step's return, which must be a dict (nested dicts allowed) of numbers of a fixed shape."""
    if not isinstance(logs, dict):
        return "returned a tensor" if isinstance(logs, tf.Tensor) else f"returned {type(logs).__name__}"
    if not flatten_logs(logs):
        return "returned an empty dict (nothing to log)"
    for name, value in flatten_logs(logs).items():
        if not isinstance(value, tf.Tensor) or value.dtype == tf.string or not value.shape.is_fully_defined():
            return f"returned {name!r} = {value!r:.80}"
    return None


def _trace(
    model_setting: str,
    network: keras.Model,
    strategy: tf.distribute.Strategy,
    model_input: Callable[[Inputs], Inputs],
    labeled: bool,
    batch: tuple[InputSpec, tf.TensorSpec],
) -> tuple[Logs, Optimizers]:
    """What train_step returns, traced (not run) on `batch`, and each optimizer the model holds with the variables
    the step applies it to (by id). Their `apply` is stood in for while tracing: an optimizer built inside a
    replica's context would take the first replica's initial value, unliftable from the trace."""
    applied: Optimizers = {}
    optimizers = list(held_optimizers(network).values())

    def recorder(optimizer: keras.optimizers.Optimizer) -> Callable[..., None]:
        def apply(grads: list[tf.Tensor], trainable_variables: list[keras.Variable] | None = None) -> None:
            if trainable_variables is not None and id(optimizer) not in applied:
                applied[id(optimizer)] = (optimizer, list(trainable_variables))

        return apply

    @tf.function(autograph=False)  # as Keras's one_step_on_data: do_not_convert
    def one_step(batch: tuple[Inputs, tf.Tensor]) -> Logs:
        data = _step_data(model_input, labeled, *batch)
        return mean_over_replicas(strategy, strategy.run(network.train_step, args=(data,)))

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


def _build_on_spec(network: keras.Model, spec: DatasetSpec, refusal: str) -> None:
    """The network's compiled loss and metrics built on a batch of the spec, as `model.fit` builds them. Raises
    SettingsError: `refusal`, then what failed."""
    try:
        build_metrics_and_loss(network, *_spec_batch(spec, model_input=True))
    except Exception as error:
        raise SettingsError(f"{refusal}: {first_line(error, 200)}") from None


def _check_engine_step_model(settings: Settings, network: keras.Model, serving: keras.Model, spec: DatasetSpec) -> None:
    """The engine's own step trains the model's output against the labels: they must fit. Raises SettingsError."""
    labels = f"the labels of {spec.name} (LABEL_KEY={spec.label_key!r}: {label_words(spec)})"
    _build_on_spec(network, spec, f"MODEL={settings.model!r}: its output {output_shape(network)} does not fit {labels}")
    # The output as the data meets it (on the general path the network is the served model: no Input of ours)
    output = serving.output if spec.as_stored else network.compute_output_spec(_spec_batch(spec, True)[0])
    check_output(settings.model, network, output, spec)


def _stored_batch(spec: DatasetSpec) -> tuple[InputSpec, tf.TensorSpec]:
    """A batch of the dataset as stored, as tf.TensorSpecs: what a model's own step is traced on."""
    return tf.nest.map_structure(lambda each: tf.TensorSpec(each.shape, each.dtype), _spec_batch(spec, False))


def _model_input(serving: keras.Model, spec: DatasetSpec) -> Callable[[Inputs], Inputs]:
    if spec.scale:
        if any(layer.name == "scale_to_unit_range" for layer in serving.layers):
            return serving.get_layer("scale_to_unit_range")
        return keras.layers.Rescaling(spec.scale, name="scale_to_unit_range")  # a model without call(): no Input
    return lambda inputs: inputs  # as stored, or what preprocess returns


def spread_seeds(built: Built, strategy: tf.distribute.Strategy) -> None:
    """Give each replica its own random stream: after the model is made and after every restore.

    A random layer's state is mirrored: every replica starts from the same value and updates its own copy
    alike, so without this all replicas would draw the same masks. Replica r's copy moves by r x the stride;
    replica 0's, the one a checkpoint saves, stays the seed's own.
    """
    if strategy.num_replicas_in_sync == 1 or not built.seeds:
        return

    @tf.function(autograph=False)
    def spread() -> None:
        def move() -> None:
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            for state in built.seeds:
                state.assign_add(tf.stack([tf.cast(replica, state.dtype) * REPLICA_SEED_STRIDE, 0]))

        strategy.run(move)

    spread()


def weights_fingerprint(built: Built) -> str:
    """sha256 of every weight, in order: equal on every worker of a multi-worker run."""
    digest = hashlib.sha256()
    for weight in built.serving.weights:
        digest.update(np.asarray(weight.numpy()).tobytes())
    return digest.hexdigest()
