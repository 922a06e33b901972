"""The export tried before the first step: what would fail after all the training fails before any of it.

`check_exportable` saves `model.keras` into a temporary directory and loads it back with safe_mode on, as
`evaluate --exported` does (the MODEL file imported, its registered classes known), then writes both exports
(train.model.export) there where the SavedModel could meet a resource nothing tracks.
A model that cannot be saved (a subclassed model without `get_config`), a layer safe_mode refuses (a Lambda, an
unregistered class) and a resource the SavedModel cannot track (a table `preprocess` uses that nothing holds)
each end in one line naming the fix, exit 2, before anything is written.
"""

from __future__ import annotations

import re
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from train.errors import SettingsError, TrainingError, first_line

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
if TYPE_CHECKING:
    import keras

    from train.model import Built

TRACK_FIX = (
    "keep every layer or tf.lookup table that preprocess uses in a global of the MODEL file (made at module level "
    "or assigned in adapt), not in a local variable or a closure"
)


def check_exportable(built: Built, settings) -> None:
    """Export `built` (or what MODEL's `export_model` returns in its place) to a temporary directory and load its
    model.keras back with safe_mode. Raises SettingsError naming the fix for a model that cannot be saved,
    loaded or served; an engine fault propagates as it is."""
    import keras

    from train.model import export, model_to_export
    from train.model_file import overrides

    model = settings.model
    try:
        own = model_to_export(settings, built)
    except TrainingError as error:  # said for the end of a run: here nothing is trained yet
        said = str(error).replace("; fix it and run again to export (the checkpoint is kept)", "")
        raise SettingsError(f"{said}: fix it (the export is tried before the first step)") from None
    own_step = own is None and built.step.own  # the model's own train_step is the step (train.custom_step)
    if own_step and not overrides(built.network, "call"):
        raise SettingsError(
            f"MODEL={model!r}: {type(built.network).__name__} trains with its own train_step and defines no call(), "
            f"so there is no model to export: {EXPORT_MODEL_FIX}, or define call(inputs)"
        )
    _check_input_names(built, own, settings)
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


def _check_input_names(built: Built, own: keras.Model | None, settings) -> None:
    """Each input of the SavedModel's signatures has a name TensorFlow takes (its op names: `INPUT_NAME`); another
    (a column "petal width", "größe") fails only when the SavedModel is written, after the training."""
    from train.model import export_endpoints

    for _, _, signature in export_endpoints(built, own):
        for spec in signature:
            if spec.name and not INPUT_NAME.match(spec.name):
                raise SettingsError(
                    f"DATASET={settings.dataset!r} with MODEL={settings.model!r}: the export's signature would take an "
                    f"input named {spec.name!r}, and TensorFlow takes only names of letters, digits and . _ - / > "
                    "(beginning with a letter, a digit or .): rename that column in the data (or the key preprocess "
                    "returns)"
                )


def _may_hold_untracked(built: Built, own: keras.Model | None) -> bool:
    """Whether the SavedModel could meet a resource nothing tracks: `preprocess` runs in it, or a layer (or the
    model) is the fork's own class. Keras's own layers track their state, so the SavedModel write (about half
    a second) is skipped for a model of them alone."""
    from train.keras_seams import all_layers

    if own is None and built.spec.runs_preprocess:
        return True
    exported = own or built.serving
    classes = {type(layer) for layer in [exported, *all_layers(exported)]}
    return any(not each.__module__.startswith("keras.") for each in classes)


def _said(error: BaseException) -> str:
    return f"{type(error).__name__}: {first_line(error, 160)}"
