"""THE EXPORT: `model.keras` for Keras and `saved_model/` for TF Serving (`export`, its endpoints), the weights' moving
averages it holds under `use_ema` (`averaged_weights`), and the export tried before the first step, so that what
would fail after all the training fails before any of it.

`check_exportable` saves `model.keras` into a temporary directory and loads it back with safe_mode on, as
`evaluate --exported` does (the MODEL file imported, its registered classes known), then writes both exports
(`export`) there where the SavedModel could meet a resource nothing tracks.
A model that cannot be saved (a subclassed model without `get_config`), a layer safe_mode refuses (a Lambda, an
unregistered class) and a resource the SavedModel cannot track (a table `preprocess` uses that nothing holds)
each end in one line naming the fix, exit 2, before anything is written.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path

import keras
import tensorflow as tf

from train.data.adapt import resources
from train.errors import SettingsError, TrainingError, first_line
from train.keras_seams import all_layers, inner_optimizers
from train.model import Built
from train.model_file import overrides
from train.outputs import name_outputs

Endpoint = tuple[str, Callable[..., dict[str, tf.Tensor]], list[tf.TensorSpec]]  # name, function, input signature

SAVE_FIX = (
    "give each subclassed model and layer get_config() returning its constructor's arguments (and "
    "from_config where they are not plain values), or build the model with keras.Input and the functional API"
)
LOAD_FIX = (
    "decorate each custom layer, model or function with @keras.saving.register_keras_serializable() in the "
    "MODEL file, and write a Lambda layer as such a registered layer (safe_mode loads no Python code from a file)"
)
EXPORT_MODEL_FIX = (
    "define export_model(model) in the MODEL file, returning the keras.Model to export in its place (a GAN: "
    "return model.generator; see examples/dcgan.py)"
)
INPUT_NAME = re.compile(r"^[A-Za-z0-9.][A-Za-z0-9_.\\/>-]*$")  # TensorFlow's op names (framework/ops.py)
TRACK_FIX = (
    "keep every layer or tf.lookup table that preprocess uses in a global of the MODEL file (made at module level "
    "or assigned in adapt), not in a local variable or a closure"
)


def check_exportable(built: Built, dataset: str) -> None:
    """Export `built` (or what MODEL's `export_model` returns in its place) to a temporary directory and load its
    model.keras back with safe_mode. Raises SettingsError naming the fix for a model that cannot be saved,
    loaded or served; an engine fault propagates as it is."""
    model = built.experiment.text
    try:
        own = model_to_export(built)
    except TrainingError as error:  # said for the end of a run: here nothing is trained yet
        said = str(error).replace("; fix it and run again to export (the checkpoint is kept)", "")
        raise SettingsError(f"{said}: fix it (the export is tried before the first step)") from None
    own_step = own is None and built.step.own  # the model's own train_step is the step (train.step)
    if own_step and not overrides(built.network, "call"):
        raise SettingsError(
            f"MODEL={model!r}: {type(built.network).__name__} trains with its own train_step and defines no call(), "
            f"so there is no model to export: {EXPORT_MODEL_FIX}, or define call(inputs)"
        )
    _check_input_names(built, own, dataset)
    with tempfile.TemporaryDirectory(prefix="train-export-check-") as directory:
        where = Path(directory)
        try:
            (own or built.serving).save(where / "model.keras")
        except Exception as error:  # what Keras raises varies: NotImplementedError, TypeError, ValueError
            fix = f"{EXPORT_MODEL_FIX}; or {SAVE_FIX}" if own_step else SAVE_FIX
            raise SettingsError(
                f"MODEL={model!r}: its model cannot be saved as model.keras ({_said(error)}): {fix}"
            ) from None
        try:
            keras.saving.load_model(where / "model.keras")  # safe_mode stays on, as evaluate --exported loads it
        except Exception as error:
            raise SettingsError(
                f"MODEL={model!r}: model.keras cannot be loaded back with safe_mode ({_said(error)}): {LOAD_FIX}"
            ) from None
        if not _may_hold_untracked(built, own):
            return
        try:
            export(built, where, own)
        except AssertionError as error:  # TensorFlow's "untracked resource" check while writing the SavedModel
            if "untracked" not in str(error):
                raise
            raise SettingsError(
                f"MODEL={model!r}: the SavedModel cannot carry a resource preprocess uses ({_said(error)}): {TRACK_FIX}"
            ) from None


def _check_input_names(built: Built, own: keras.Model | None, dataset: str) -> None:
    """Each input of the SavedModel's signatures has a name TensorFlow takes (its op names: `INPUT_NAME`); another
    (a column "petal width", "größe") fails only when the SavedModel is written, after the training."""
    for _, _, signature in serving_endpoints(built, own):
        for spec in signature:
            if spec.name and not INPUT_NAME.match(spec.name):
                raise SettingsError(
                    f"DATASET={dataset!r} with MODEL={built.experiment.text!r}: the export's signature would take an "
                    f"input named {spec.name!r}, and TensorFlow takes only names of letters, digits and . _ - / > "
                    "(beginning with a letter, a digit or .): rename that column in the data (or the key preprocess "
                    "returns)"
                )


def _may_hold_untracked(built: Built, own: keras.Model | None) -> bool:
    """Whether the SavedModel could meet a resource nothing tracks: `preprocess` runs in it, or a layer (or the
    model) is the fork's own class. Keras's own layers track their state, so the SavedModel write (about half
    a second) is skipped for a model of them alone."""
    if own is None and built.spec.runs_preprocess:
        return True
    exported = own or built.serving
    classes = {type(layer) for layer in [exported, *all_layers(exported)]}
    return any(not each.__module__.startswith("keras.") for each in classes)


def _said(error: BaseException) -> str:
    return f"{type(error).__name__}: {first_line(error, 160)}"


def serving_endpoints(built: Built, model: keras.Model | None = None) -> list[Endpoint]:
    """(name, function, input signature) of each SavedModel endpoint, the default one first.

    `serve` takes what clients have, each feature under its own name: the stored feature (a batch of it); on the
    general path, each stored feature `preprocess` reads (an image as its JPEG or PNG bytes), run through
    `preprocess(training=False)`, or the columns by name. With `preprocess`, `serve_inputs` takes what it returns.
    Each returns the outputs named as train.outputs has them (`scores` and `classes` for a class label). For what
    MODEL's `export_model` returned (`model`): its `serve` on its own Inputs, by name (a generator's images under
    its own output name, not `output_0`)."""
    serving, spec = built.serving, built.spec
    if model is not None:
        named = name_outputs(model, spec)
        signature = [tf.TensorSpec(tensor.shape, tensor.dtype, name=tensor.name) for tensor in model.inputs]
        if len(model.inputs) == 1:
            return [("serve", lambda values: named(model(values, training=False)), signature)]
        return [("serve", lambda *values: named(model(list(values), training=False)), signature)]
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

            def by_name(*values: tf.Tensor) -> dict[str, tf.Tensor]:
                return named(serving(dict(zip(names, values, strict=True)), training=False))

            endpoints.append(("serve_inputs", by_name, inputs))
        else:
            inputs = [tf.TensorSpec((None, *spec.inputs.shape), spec.inputs.dtype, name="inputs")]
            endpoints.append(("serve_inputs", lambda values: named(serving(values, training=False)), inputs))
    return endpoints


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
    for name, function, signature in serving_endpoints(built, model):  # the first added is serving_default
        archive.add_endpoint(name=name, fn=function, input_signature=signature)
    archive.write_out(str(staging), verbose=False)
    shutil.rmtree(saved_model, ignore_errors=True)
    os.replace(staging, saved_model)
    return {"keras": str(keras_path), "saved_model": str(saved_model)}


def model_to_export(built: Built) -> keras.Model | None:
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
            f"MODEL={built.experiment.text!r}: export_model raised {type(error).__name__}: "
            f"{first_line(error, 200)}; fix it and run again to export (the checkpoint is kept)"
        ) from None
    if not isinstance(model, keras.Model) or not model.inputs:
        raise TrainingError(
            f"MODEL={built.experiment.text!r}: export_model returned {type(model).__name__}, not a keras.Model with "
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
