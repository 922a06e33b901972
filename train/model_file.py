"""MODEL's file: the functions a fork defines, loaded once a process.

    build_model(input_shape, num_classes, learning_rate) -> a compiled keras.Model      (required)
    preprocess(example, training, seed) -> (inputs, label)                              (optional)
    build_callbacks(context) -> a list of keras.callbacks.Callback                       (optional)
    export_model(model) -> the keras.Model to export in the trained model's place        (optional)
    adapt(context): fits the layers preprocess uses, on the raw training data (train.adapt)  (optional)

`build_model` is what train.model calls (its keyword-only parameters: hyperparameters, train.hparams, and
`context`, train.context); `preprocess` is what the data path (train.data.examples) runs per example, in
tf.data, in training, evaluation and the export; `build_callbacks` gives the callbacks the loop calls
(train.callbacks). examples/mlp.py, examples/resnet.py and examples/early_stopping.py say each in full.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

from train.errors import SettingsError, first_line
from train.settings import is_model_path

RESNET_EXAMPLE = "examples/resnet.py"  # where a fork finds a preprocess to start from
CALLBACKS_EXAMPLE = "examples/early_stopping.py"  # ... and build_callbacks
TEXT_EXAMPLE = "examples/text.py"  # ... and adapt


@dataclass(frozen=True)
class ModelFile:
    text: str  # MODEL as given
    build_model: Callable
    preprocess: Callable | None = None
    build_callbacks: Callable | None = None
    export_model: Callable | None = None  # a GAN's: its generator (examples/gan.py)
    adapt: Callable | None = None
    module: Any = None  # the imported file: its globals hold the layers `preprocess` uses (train.adapt)


# The MODEL file's optional functions: what each must be, and the example that shows it.
OPTIONAL_SEAMS = {
    "preprocess": ("preprocess(example, training, seed) -> (inputs, label)", RESNET_EXAMPLE),
    "build_callbacks": ("build_callbacks(context) -> a list of keras.callbacks.Callback", CALLBACKS_EXAMPLE),
    "export_model": ("export_model(model) -> the keras.Model to export", "examples/gan.py"),
    "adapt": ("adapt(context) that fits the layers preprocess uses on context.examples(n)", TEXT_EXAMPLE),
}


@cache
def load_model_file(text: str) -> ModelFile:
    """MODEL's functions, its module imported once a process. Raises SettingsError."""
    try:
        if is_model_path(text):
            path = Path(text).expanduser().resolve()
            name = f"train_model_{path.stem}"
            spec = importlib.util.spec_from_file_location(name, path)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module  # so the classes it defines can be found again by name
            spec.loader.exec_module(module)
        else:
            module = importlib.import_module(text)
    except Exception as error:
        raise SettingsError(
            f"MODEL={text!r} could not be imported ({type(error).__name__}: {first_line(error, 200)})"
        ) from None
    build = getattr(module, "build_model", None)
    if not callable(build):
        raise SettingsError(
            f"MODEL={text!r} has no build_model: define build_model(input_shape, num_classes, learning_rate) "
            "returning a compiled keras.Model (see examples/mlp.py)"
        )
    seams = {}
    for name, (signature, example) in OPTIONAL_SEAMS.items():
        seams[name] = getattr(module, name, None)
        if seams[name] is not None and not callable(seams[name]):
            raise SettingsError(
                f"MODEL={text!r}: {name} is a {type(seams[name]).__name__}, not a function: define {signature} "
                f"(see {example})"
            )
    return ModelFile(text, build, module=module, **seams)
