"""The fork contract, for whatever MODEL and DATASET this project resolves to (tests/test_project.py).

    python -m tests.harness.contract OUTPUT_DIR

MODEL builds for DATASET's spec (read from the dataset's info: nothing is downloaded; with `preprocess`, what
it returns for a random example of the dataset's features; a `context` whose sample is that random data, and
`build_callbacks` with it where the file has one), takes one training step on random data of that
spec through the engine's own feed and training call, and its export saves and loads with Keras's
safe_mode, and serves what clients send (the stored features `preprocess` reads: images as their bytes, text as
its strings, numbers and dict columns by name). MODEL's `adapt` runs first, on random examples of the features.
Prints one JSON object; a fork the engine refuses fails with the engine's one line first on stderr ("error: ..."),
exit 2 (or 1).
"""

from __future__ import annotations

import json
import math
import sys
import traceback
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from train.callbacks import build_callbacks
from train.context import Context
from train.data.adapt import AdaptContext
from train.data.examples import BYTES_SUFFIX, random_record
from train.data.feeds import adapter
from train.data.opening import open_builder, open_source
from train.data.source import Data, SerializedSplit, Split
from train.data.spec import inspect
from train.dataset_path import Survey
from train.errors import SettingsError, TrainingError, first_line
from train.exportable import export
from train.model import build
from train.model_file import load_model_file
from train.settings import load_settings
from train.step import make_calls

BATCH = 8


def random_split(spec, examples: int = 2 * BATCH) -> Split | SerializedSplit:
    """Examples of the spec's shapes and dtypes: images 0-255, classes in range, multi-hot 0/1, values; on the
    general path, stored records of random values of the dataset's features (images of random sizes)."""
    rng = np.random.default_rng(0)
    if spec.records:
        records = [random_record(spec.examples.features, rng) for _ in range(examples)]
        return SerializedSplit(tf.constant(records, tf.string), spec)

    def values(shape, dtype, high):
        if np.dtype(dtype).kind == "f":
            return rng.normal(size=(examples, *shape)).astype(dtype)
        return rng.integers(0, high, size=(examples, *shape)).astype(dtype)

    features = values(spec.feature_shape, spec.feature_dtype, 256 if spec.is_image else 2)
    classes = spec.num_classes if spec.label_shape == () and spec.num_classes else 2
    return Split(features, values(spec.label_shape, spec.label_dtype, classes))


def main(output_dir: Path) -> dict:
    # project/defaults.env and what the caller's environment sets (tests/test_project.py passes none of the user's)
    settings = load_settings({"OUTPUT_DIR": str(output_dir)}, dotenv_path="/nonexistent")
    preprocess = load_model_file(settings.model).preprocess
    # a folder or file: written once as TFDS records (docs/data.md), then as any
    if isinstance(settings.source, Survey):
        opened = open_source(settings, lambda line: print(line, file=sys.stderr))
        builder, settings, preprocess = opened.builder, opened.settings, preprocess or opened.columns(settings)
    else:  # a TFDS name: its features alone, not prepared here
        builder = open_builder(settings.dataset, settings.tfds_data_dir)
    adapt_on_random_examples(settings, builder.info.features)  # MODEL's adapt, before preprocess is traced
    spec = inspect(builder, settings, count=False, preprocess=preprocess)
    strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    split = random_split(spec)
    context = Context(global_batch=BATCH, replicas=1, workers=1, steps_per_epoch=1, epochs=settings.epochs,
                      seed=settings.seed, precision="float32", output_dir=output_dir,
                      _sample=Data(spec, split, split).sample)  # fmt: skip
    experiment = load_model_file(settings.model)
    built = build(settings, experiment, spec, strategy, context)
    callbacks = build_callbacks(experiment, context)
    feed = adapter(strategy, split).train_feed(BATCH, settings.seed, 0, 1)
    result = make_calls(built, strategy, feed, BATCH, jit_compile=False)(1)
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = export(built, output_dir)
    loaded = keras.saving.load_model(paths["keras"])  # safe_mode on, as evaluate --exported loads it
    inputs = next(iter(feed.iterator))[0] if spec.records else split.features[:BATCH]  # what the model gets
    served = loaded(inputs, training=False)
    signature = tf.saved_model.load(paths["saved_model"]).signatures["serving_default"]
    outputs = signature(**sent_by_client(spec, split, signature.structured_input_signature[1]))
    return {
        "model": settings.model, "dataset": spec.name, "loss_finite": math.isfinite(result.loss),
        "metrics": sorted(result.metrics), "served_shape": list(tf.nest.flatten(served)[0].shape),
        "callbacks": len(callbacks), "saved_model": (Path(paths["saved_model"]) / "saved_model.pb").is_file(),
        "served_default_shape": list(_scores(outputs).shape), "served_outputs": sorted(outputs),
    }  # fmt: skip


def sent_by_client(spec, split, signature: dict) -> dict:
    """What a client sends serving_default for the split's first batch, each input by name: the stored feature as
    it is (a batch of it); on the general path an image as its encoded bytes, text as its string, a number as
    stored, a column of a dict feature by the column's own name."""
    if not spec.records:
        return {spec.feature_key: tf.constant(split.features[:BATCH])}
    records = split.records[:BATCH]
    stored = [spec.examples.features.deserialize_example(record) for record in records]
    images = set(spec.examples.images)
    sent = {}
    for name in signature:
        if name in images:  # its stored bytes (PNG or JPEG), as a client has the file
            sent[name] = tf.stack([spec.examples.decode(record)[name + BYTES_SUFFIX] for record in records])
        else:
            sent[name] = tf.stack([_column(example, name) for example in stored])
    return sent


def _scores(outputs: dict):
    """The export's scores by name (a class or multi-hot label), its `outputs` (a value), or its only output."""
    for name in ("scores", "outputs"):
        if name in outputs:
            return outputs[name]
    return next(iter(outputs.values()))


def adapt_on_random_examples(settings, features) -> None:
    """MODEL's adapt(context), where it has one, on examples of random values of the dataset's features (what
    `context.examples` gives a run: dicts of every feature as decoded, batched)."""
    adapt = load_model_file(settings.model).adapt
    if adapt is None:
        return
    rng = np.random.default_rng(0)
    records = tf.constant([random_record(features, rng) for _ in range(2 * BATCH)])
    decoded = tf.data.Dataset.from_tensor_slices(records).map(features.deserialize_example)
    adapt(AdaptContext(settings.seed, lambda n: decoded.take(n).ragged_batch(BATCH)))


def _column(example: dict, name: str):
    """A stored feature by name, or a column of a dict feature by its own name."""
    if name in example:
        return example[name]
    return next(value[name] for value in example.values() if isinstance(value, dict) and name in value)


if __name__ == "__main__":
    try:
        outcome = main(Path(sys.argv[1]))
    except (SettingsError, TrainingError) as error:  # the engine's own one line, as `python -m train` prints it
        print(f"error: {error}", file=sys.stderr)
        sys.exit(error.exit_code)
    except Exception as error:  # not foreseen: its one line first, then where it came from
        print(f"error: {type(error).__name__}: {first_line(error, 300)}", file=sys.stderr)
        traceback.print_exc()
        sys.exit(1)
    print(json.dumps(outcome))
