"""The fork contract, for whatever MODEL and DATASET this project resolves to (tests/test_project.py).

    python -m tests.harness.contract OUTPUT_DIR

MODEL builds for DATASET's spec (read from the dataset's info: nothing is downloaded), takes one training
step on random data of that spec through the engine's own feed and training call, and its export saves and
loads with Keras's safe_mode. Prints one JSON object.
"""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from train.data import Split, make_feed
from train.data.source import inspect, open_builder
from train.model import build, export
from train.settings import load_settings
from train.step import make_train_calls

BATCH = 8


def random_split(spec, examples: int = 2 * BATCH) -> Split:
    """Examples of the spec's shapes and dtypes: images 0-255, classes in range, multi-hot 0/1, values."""
    rng = np.random.default_rng(0)

    def values(shape, dtype, high):
        if np.dtype(dtype).kind == "f":
            return rng.normal(size=(examples, *shape)).astype(dtype)
        return rng.integers(0, high, size=(examples, *shape)).astype(dtype)

    features = values(spec.feature_shape, spec.feature_dtype, 256 if spec.is_image else 2)
    classes = spec.num_classes if spec.label_shape == () and spec.num_classes else 2
    return Split(features, values(spec.label_shape, spec.label_dtype, classes))


def main(output_dir: Path) -> dict:
    settings = load_settings({"OUTPUT_DIR": str(output_dir)}, environ={}, dotenv_path="/nonexistent")
    spec = inspect(open_builder(settings), settings, count=False)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    built = build(settings, spec, strategy)
    feed = make_feed(strategy, random_split(spec), BATCH, settings.seed, 0, 1)
    result = make_train_calls(built, strategy, feed, BATCH, jit_compile=False)(1)
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = export(built, output_dir)
    loaded = keras.saving.load_model(paths["keras"])  # safe_mode on, as evaluate --exported loads it
    served = loaded(random_split(spec).features[:BATCH], training=False)
    return {
        "model": settings.model, "dataset": spec.name, "loss_finite": math.isfinite(result.loss),
        "metrics": sorted(result.metrics), "served_shape": list(served.shape),
        "saved_model": (Path(paths["saved_model"]) / "saved_model.pb").is_file(),
    }  # fmt: skip


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]))))
