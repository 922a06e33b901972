"""MODEL in: the fork's compiled model, checked against the data, and the model that trains and is exported.

The contract a model file keeps is one function, `build_model(input_shape, num_classes, learning_rate)`,
returning a compiled `keras.Model` (examples/mlp.py says it in full); its keyword-only parameters get the
hyperparameters' values (train.hparams) and, one named `context`, the run's facts (train.context). Around it
the engine puts what the data needs and the export must carry: an `Input` of the feature's stored shape and
dtype, named after the feature, then, for a TFDS image, the scaling of uint8 to [0, 1]. That composed model
(`Built.serving`) is what trains, what evaluates and what `model.keras` and `saved_model/` hold, so the export
serves exactly what was evaluated.

The MODEL file is loaded once (train.model_file.Experiment) and kept in `Built.experiment`. This module traces no
step and imports none: `make` returns the model made and checked (`Made`), the step's modules choose its step
(train.custom_step.choose_step) and `Made.with_step` completes it into a `Built` that keeps it. train.built.build
does the three in that order, so that every caller has the step traced before a checkpoint restores into it.
"""

from __future__ import annotations

import contextlib
import hashlib
import inspect
import os
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import keras
import numpy as np
import tensorflow as tf

from train.context import Context
from train.data.adapt import resources
from train.data.examples import Inputs, InputSpec
from train.data.spec import DatasetSpec
from train.errors import SettingsError, TrainingError, first_line
from train.hparams import CONTEXT, taken_by
from train.keras_seams import all_layers, build_metrics_and_loss, compiled, inner_optimizers
from train.model_file import Experiment, overrides, refuse_step
from train.outputs import name_outputs
from train.replica_statistics import ReplicaStatistics, replica_state, synchronize_batch_norm
from train.settings import Settings

SymbolicInputs = keras.KerasTensor | dict[str, keras.KerasTensor]
Endpoint = tuple[str, Callable[..., dict[str, tf.Tensor]], list[tf.TensorSpec]]  # name, function, input signature

# A replica's random stream is the seed's, moved by this much per replica id: replicas and workers draw
# different numbers (Dropout masks, augmentations), each reproducible from SEED.
REPLICA_SEED_STRIDE = 1_000_003
CONVOLUTIONS = (
    keras.layers.Conv1D, keras.layers.Conv2D, keras.layers.Conv3D, keras.layers.Conv1DTranspose,
    keras.layers.Conv2DTranspose, keras.layers.Conv3DTranspose, keras.layers.DepthwiseConv1D,
    keras.layers.DepthwiseConv2D, keras.layers.SeparableConv1D, keras.layers.SeparableConv2D,
)  # fmt: skip


class ChosenStep(Protocol):
    """What `Built` keeps of its step (train.custom_step's EngineStep or OwnStep, chosen by train.built.build)."""

    @property
    def own(self) -> bool: ...  # the model's own train_step is the step

    @property
    def accumulates(self) -> bool: ...  # the step can accumulate micro-batches


@dataclass(frozen=True)
class Made:
    """MODEL's model made inside the strategy's scope and checked (`make`), its step not chosen yet: `network`,
    `serving` as `Built` holds them; `batch` and `model_input`: what a model's own step is traced on."""

    network: keras.Model
    serving: keras.Model
    spec: DatasetSpec
    experiment: Experiment

    @property
    def batch(self) -> tuple[InputSpec, tf.TensorSpec]:
        return _stored_batch(self.spec)

    @property
    def model_input(self) -> Callable[[Inputs], Inputs]:
        return _model_input(self.serving, self.spec)

    def with_step(self, step: ChosenStep, strategy: tf.distribute.Strategy) -> Built:
        """The built model, keeping `step` (chosen on `network`): its random layers' state (`seeds`, taken after
        the step's trace, which may make layers) given each replica its own stream, its replica state gathered."""
        weights = {id(variable) for variable in self.serving.weights}
        seeds = tuple(variable.value for variable in self.serving.variables if id(variable) not in weights)
        statistics = ReplicaStatistics(replica_state(self.serving), strategy)
        built = Built(self.network, self.serving, self.spec, seeds, self.experiment, step, statistics)
        spread_seeds(built, strategy)
        return built


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
    step: ChosenStep  # the engine's or the model's own, chosen once (train.custom_step.choose_step)
    statistics: ReplicaStatistics | None = None

    @property
    def custom_step(self) -> ChosenStep | None:
        """The model's own train_step where it is the step, else None."""
        return self.step if self.step.own else None

    def average_statistics(self) -> None:
        """Every replica's and worker's copy of the replica state made their mean (a collective across workers):
        before each checkpoint, each evaluation, the export and the workers' final agreement check."""
        if self.statistics is not None:
            self.statistics.average()

    @property
    def model_input(self) -> Callable[[Inputs], Inputs]:
        """The stored feature as `network` gets it (an image scaled to [0, 1]): what a model's own step is given."""
        return _model_input(self.serving, self.spec)

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


def wants_context(settings: Settings, build) -> bool:
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


def make(
    settings: Settings,
    experiment: Experiment,
    spec: DatasetSpec,
    strategy: tf.distribute.Strategy,
    context: Context | None = None,
    say: Callable[[str], None] | None = None,
) -> Made:
    """MODEL's model for this dataset, made inside the strategy's scope and checked; its step is chosen next
    (train.built.build). `context`: the run's facts, for a build_model that declares it (train.context.run_context).
    `say`: where SYNC_BATCH_NORM's warnings go (None: nowhere, for the commands that do not train). `experiment`:
    MODEL's file, loaded once by the command and passed down.

    Raises SettingsError for a model that breaks the contract, before anything is written."""
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
            _build_compiled(settings, network, spec)
        else:
            _check_engine_step_model(settings, network, serving, spec)
    return Made(network, serving, spec, experiment)


def _build_on_spec(network: keras.Model, spec: DatasetSpec, refusal: Callable[[], str]) -> None:
    """The network's compiled loss and metrics built on a batch of the spec, as `model.fit` builds them. Raises
    SettingsError: `refusal()`, then what failed."""
    try:
        build_metrics_and_loss(network, *_spec_batch(spec, model_input=True))
    except Exception as error:
        raise SettingsError(f"{refusal()}: {first_line(error, 200)}") from None


def _check_engine_step_model(settings: Settings, network: keras.Model, serving: keras.Model, spec: DatasetSpec):
    """The engine's own step trains the model's output against the labels: they must fit. Raises SettingsError."""
    _build_on_spec(network, spec, lambda: (
        f"MODEL={settings.model!r}: its output {_output_shape(network)} does not fit the labels of "
        f"{spec.name} (LABEL_KEY={spec.label_key!r}: {_label_kind(spec)})"
    ))  # fmt: skip
    # The output as the data meets it (on the general path the network is the served model: no Input of ours)
    output = serving.output if spec.as_stored else network.compute_output_spec(_spec_batch(spec, True)[0])
    _check_output(settings, network, output, spec)


def _build_compiled(settings: Settings, network: keras.Model, spec: DatasetSpec) -> None:
    """A model with its own train_step: what it compiled (a loss, metrics) built as `model.fit` builds them.
    Raises SettingsError."""
    what = " and ".join(compiled(network))
    if what:  # a GAN compiles neither: nothing to build, and nothing to say of a compiled loss
        _build_on_spec(network, spec, lambda: (
            f"MODEL={settings.model!r}: its compiled {what} cannot be built on the data's spec (as model.fit "
            "builds them)"
        ))  # fmt: skip


def _stored_batch(spec: DatasetSpec) -> tuple[InputSpec, tf.TensorSpec]:
    """A batch of the dataset as stored, as tf.TensorSpecs: what a model's own step is traced on."""
    features, labels = _spec_batch(spec, model_input=False)
    tensors = [tf.TensorSpec(tensor.shape, tensor.dtype) for tensor in tf.nest.flatten((features, labels))]
    return tf.nest.pack_sequence_as((features, labels), tensors)


def _model_input(serving: keras.Model, spec: DatasetSpec) -> Callable[[Inputs], Inputs]:
    if spec.scale:
        if any(layer.name == "scale_to_unit_range" for layer in serving.layers):
            return serving.get_layer("scale_to_unit_range")
        return keras.layers.Rescaling(spec.scale, name="scale_to_unit_range")  # a model without call(): no Input
    return lambda inputs: inputs  # as stored, or what preprocess returns


def _check_output(settings: Settings, network: keras.Model, output: SymbolicInputs, spec: DatasetSpec) -> None:
    """What Keras builds without a word but cannot train as meant: an output no gradient flows through (an integer
    one), and under sparse categorical cross-entropy one whose last axis is not one score per class (wider trains
    a classifier of classes the data lacks; 1 trains to NaN). Raises SettingsError."""
    if not hasattr(output, "shape"):  # several outputs: Keras's own checks only
        return
    if not keras.backend.is_float_dtype(output.dtype):
        raise SettingsError(
            f"MODEL={settings.model!r}: its output is {output.dtype}, through which no gradient flows: end the model "
            "with a floating-point output (no cast to an integer type inside it)"
        )
    loss = keras.losses.get(network.loss) if isinstance(network.loss, str) else network.loss
    sparse = getattr(loss, "fn", loss) is keras.losses.sparse_categorical_crossentropy
    classes = spec.num_classes
    if sparse and classes is not None and spec.label_shape == () and output.shape[-1] != classes:
        scores = f"{output.shape[-1]} class{'es' if output.shape[-1] != 1 else ''}"
        raise SettingsError(
            f"MODEL={settings.model!r}: its output {tuple(output.shape)} scores {scores}, but each label of "
            f"{spec.name} (LABEL_KEY={spec.label_key!r}) is one of {classes} (0-{classes - 1}) under sparse "
            "categorical cross-entropy: end the model with num_classes units, like Dense(num_classes, "
            "activation='softmax')"
        )


def _output_shape(network: keras.Model) -> str:
    """The model's one output's shape in words: `model.outputs`, since a Sequential model, what the general path
    trains as it is, has no `.output` of its own ("never been called")."""
    with contextlib.suppress(Exception):  # a subclassed model (no Inputs), several outputs
        (output,) = network.outputs
        return str(tuple(output.shape))
    return "(unknown shape)"


def _label_kind(spec: DatasetSpec) -> str:
    if spec.label_shape == () and spec.num_classes is not None:
        return f"a class of {spec.num_classes}"
    if spec.label_shape == ():
        return f"a {spec.label_dtype} value"
    return f"{spec.label_dtype} of shape {spec.label_shape}"


def spread_seeds(built: Built, strategy) -> None:
    """Give each replica its own random stream: after the model is made and after every restore.

    A random layer's state is mirrored: every replica starts from the same value and updates its own copy
    alike, so without this all replicas would draw the same masks. Replica r's copy moves by r x the stride;
    replica 0's, the one a checkpoint saves, stays the seed's own.
    """
    if strategy.num_replicas_in_sync == 1 or not built.seeds:
        return

    @tf.function(autograph=False)
    def spread():
        def move():
            replica = tf.distribute.get_replica_context().replica_id_in_sync_group
            for state in built.seeds:
                state.assign_add(tf.stack([tf.cast(replica, state.dtype) * REPLICA_SEED_STRIDE, 0]))

        strategy.run(move)

    spread()


@contextlib.contextmanager
def averaged_weights(built: Built) -> Iterator[None]:
    """With `use_ema`, the weights' moving averages in place of the weights, and the weights back after."""
    optimizer = next((each for each in inner_optimizers(built.optimizer) if getattr(each, "use_ema", False)), None)
    if optimizer is None:
        yield
        return
    variables = built.network.trainable_variables
    kept = [tf.identity(variable.value) for variable in variables]
    optimizer.finalize_variable_values(variables)
    try:
        yield
    finally:
        for variable, value in zip(variables, kept, strict=True):
            variable.assign(value)


def use_averaged_weights(built: Built) -> None:
    """With `use_ema`, put the moving averages in place for good (evaluate, after restoring a checkpoint)."""
    for each in inner_optimizers(built.optimizer):
        if getattr(each, "use_ema", False):
            each.finalize_variable_values(built.network.trainable_variables)


def serving_endpoints(built: Built) -> list[Endpoint]:
    """(name, function, input signature) of each SavedModel endpoint, the default one first.

    `serve` takes what clients have, each feature under its own name: the stored feature (a batch of it); on the
    general path, each stored feature `preprocess` reads (an image as its JPEG or PNG bytes), run through
    `preprocess(training=False)`, or the columns by name. With `preprocess`, `serve_inputs` takes what it returns.
    Each returns the outputs named as train.outputs has them (`scores` and `classes` for a class label)."""
    serving, spec = built.serving, built.spec
    named = name_outputs(built.network, spec)
    if spec.as_stored:
        signature = [tf.TensorSpec((None, *spec.feature_shape), spec.feature_dtype, name=spec.feature_key)]
        return [("serve", lambda features: named(serving(features, training=False)), signature)]
    serve, signature = spec.examples.serving_function(serving, spec.inputs)
    endpoints = [("serve", lambda *batch: named(serve(*batch)), signature)]
    if spec.runs_preprocess:
        if isinstance(spec.inputs, dict):
            names = list(spec.inputs)
            inputs = [tf.TensorSpec((None, *s.shape), s.dtype, name=name) for name, s in spec.inputs.items()]
            endpoints.append(("serve_inputs", lambda *values: named(serving(dict(zip(names, values, strict=True)),
                                                                              training=False)), inputs))  # fmt: skip
        else:
            inputs = [tf.TensorSpec((None, *spec.inputs.shape), spec.inputs.dtype, name="inputs")]
            endpoints.append(("serve_inputs", lambda values: named(serving(values, training=False)), inputs))
    return endpoints


def export_endpoints(built: Built, model: keras.Model | None = None) -> list[Endpoint]:
    """The SavedModel's endpoints: the engine's (`serving_endpoints`), or those of what MODEL's `export_model`
    returned (`model`), on its own inputs."""
    return serving_endpoints(built) if model is None else [_own_endpoint(model, built.spec)]


def export(built: Built, output_dir: Path, model: keras.Model | None = None) -> dict[str, str]:
    """`model.keras` for Keras and `saved_model/` for TF Serving, each replaced whole or not at all.

    `model.keras` is the model that trained: on the stored feature (scaled in front of it), or on what
    `preprocess` returns. `saved_model/`'s default signature takes what clients send (`serving_endpoints`).
    Both call the model with training=False: random layers (augmentation, dropout) are off in what is served.
    `model`: what MODEL's `export_model` returned in its place (a GAN's generator), served on its own inputs."""
    serving = built.serving if model is None else model
    keras_path = output_dir / "model.keras"
    staging_keras = output_dir / "model.tmp.keras"
    serving.save(staging_keras)
    os.replace(staging_keras, keras_path)

    saved_model = output_dir / "saved_model"
    staging = output_dir / "saved_model.tmp"
    shutil.rmtree(staging, ignore_errors=True)
    archive = keras.export.ExportArchive()
    archive.track(serving)
    for resource in preprocess_resources(built) if model is None else ():  # the vocabularies and tables
        archive.track(resource)
    for name, function, signature in export_endpoints(built, model):  # the first added is serving_default
        archive.add_endpoint(name=name, fn=function, input_signature=signature)
    archive.write_out(str(staging), verbose=False)
    shutil.rmtree(saved_model, ignore_errors=True)
    os.replace(staging, saved_model)
    return {"keras": str(keras_path), "saved_model": str(saved_model)}


def _own_endpoint(model: keras.Model, spec: DatasetSpec) -> Endpoint:
    """`serve` for a model exported in the trained one's place: its own Inputs, by name; its outputs named as
    train.outputs has them (a generator's images under its own output name, not `output_0`)."""
    inputs = model.inputs
    named = name_outputs(model, spec)
    signature = [tf.TensorSpec(tensor.shape, tensor.dtype, name=tensor.name) for tensor in inputs]
    if len(inputs) == 1:
        return "serve", lambda values: named(model(values, training=False)), signature
    return "serve", lambda *values: named(model(list(values), training=False)), signature


def model_to_export(settings: Settings, built: Built) -> keras.Model | None:
    """What MODEL's `export_model(model)` returns (None where it defines none). Raises TrainingError for what is
    not a keras.Model with Inputs (the run's checkpoint stays: fix it and run again to export)."""
    export_model = built.experiment.export_model
    if export_model is None:
        return None
    try:
        model = export_model(built.network)
        model.inputs  # noqa: B018 (a subclassed model without Inputs has no signature to serve)
    except Exception as error:
        raise TrainingError(
            f"MODEL={settings.model!r}: export_model raised {type(error).__name__}: {first_line(error, 200)}; fix "
            "it and run again to export (the checkpoint is kept)"
        ) from None
    if not isinstance(model, keras.Model) or not model.inputs:
        raise TrainingError(
            f"MODEL={settings.model!r}: export_model returned {type(model).__name__}, not a keras.Model with "
            "keras.Inputs; fix it and run again to export (the checkpoint is kept)"
        )
    return model


def preprocess_resources(built: Built) -> list[keras.layers.Layer | tf.saved_model.experimental.TrackableResource]:
    """The layers and tables of the MODEL file that `preprocess` may use (train.data.adapt.resources): what the
    export's default signature runs besides the model, so the SavedModel must carry them."""
    spec = built.spec
    if not spec.runs_preprocess:
        return []
    found = resources(built.experiment.module).values()
    return [each for each in found if getattr(each, "built", True)]  # a layer never called is not in the graph


def weights_fingerprint(built: Built) -> str:
    """sha256 of every weight, in order: equal on every worker of a multi-worker run."""
    digest = hashlib.sha256()
    for weight in built.serving.weights:
        digest.update(np.asarray(weight.numpy()).tobytes())
    return digest.hexdigest()
