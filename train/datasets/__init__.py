"""The template's offline datasets: TFDS builders that need no network (`synthetic_*`, train.datasets.synthetic).

`registered()` is TFDS with them and the fork's (`project.datasets`) registered, by importing their modules: what
opening a TFDS name (train.data.opening) and telling a name from a path (train.dataset_path) both ask. Nothing
here imports the rest of the engine; the builders import TFDS, not TensorFlow, until they generate.
"""

from __future__ import annotations

from types import ModuleType


def registered() -> ModuleType:
    """TFDS, with the template's offline datasets and the fork's (`project.datasets`) registered by importing them."""
    import importlib
    import importlib.util

    import tensorflow_datasets as tfds

    import train.datasets.synthetic  # noqa: F401  (the template's offline datasets, registered by importing)

    if importlib.util.find_spec("project.datasets") is not None:
        importlib.import_module("project.datasets")  # a fork's builders, registered by importing them
    return tfds
