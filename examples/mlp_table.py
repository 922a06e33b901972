"""The default MODEL on a table (a CSV or JSON Lines DATASET with MODEL unset, or MODEL=examples.mlp): the
documented model of examples/mlp.py, Dense(64, relu) -> Dense(num_classes, softmax), behind a preprocessing
adapted on the train split and carried into the export, so that `serving_default` takes the raw columns.
A label that is a value (as docs/data.md guesses it, or LABEL_KIND=value) gets a regression head instead:
Dense(64, relu) -> Dense(1), mean squared error, MAE and RMSE (`mae`, `rmse`). Its target is normalised with
the train split's mean and deviation (`context.sample(n, labels=True)` over the whole split, summed in float64
in the stored order: the same on every worker and start), and its last layer (Rescaling: y * deviation + mean)
undoes that, so the loss, the metrics and `predict`'s "prediction" are in the label's units.

    python -m train fit --dataset ./table.csv                        # MODEL unset: this file
    python -m train predict --output-dir runs/default rows.csv       # raw rows, an empty cell included

Each column but the label, in the order of their names:
- a number: normalised with the train split's mean and variance; a missing one (an empty cell, stored as NaN)
  is the train mean (0 once normalised), and a float column adds an indicator, 1.0 where it is missing;
- text with at most LOOKUP_VALUES distinct values in the train split: looked up, one-hot (a value the train
  split lacks: a slot of its own);
- other text: a bag of words, TextVectorization's multi-hot over at most BAG_TOKENS tokens.
All side by side in one float32 vector, the MLP's input.

`adapt(context)` reads the whole train split once more for each bag of words, in its stored order (the same
on every worker and every start); the statistics are summed in float64 in that order, so every worker holds the
same numbers. The layers are module globals (NUMBERS, LOOKUPS, BAGS), where the engine finds them: their state
is run.json's "adapted" (compared between workers and at each start) and the export carries them.
examples/tabular.py (numbers only, no preprocess) and examples/tabular_text.py (a lookup) are smaller models to
start your own from.
"""

from __future__ import annotations

from collections import Counter

import keras
import numpy as np
import tensorflow as tf
from keras import layers

from examples import mlp

LOOKUP_VALUES = 50  # text with at most this many distinct values in the train split is one-hot, more: words
BAG_TOKENS = 10_000  # a bag of words' vocabulary, the out-of-vocabulary token included
WHOLE_SPLIT = 2**62  # context.examples(n): every training row

NUMBERS: layers.Normalization | None = None  # the numeric columns, each to mean 0 and variance 1
LOOKUPS: dict[str, layers.StringLookup] = {}  # a text column of few values -> its one-hot lookup
BAGS: dict[str, layers.TextVectorization] = {}  # other text -> its multi-hot bag of words
_columns: dict[str, list[str]] = {"numbers": [], "floats": []}  # numeric columns; those that may be NaN
_label: list[str] = ["label"]


def build_model(input_shape: tuple[int, ...], num_classes: int | None, learning_rate: float, *, context) -> keras.Model:
    """A class label: the documented model (examples/mlp.py). A value (num_classes None): the same hidden layer and a
    regression head whose target is normalised with the train split's mean and deviation, undone by its last layer,
    so that the loss, the metrics and the predictions are in the label's units."""
    if num_classes is not None:
        return mlp.build_model(input_shape, num_classes, learning_rate)
    mean, deviation = _label_statistics(context.sample(WHOLE_SPLIT, labels=True))
    model = keras.Sequential(name="regressor")
    model.add(keras.Input(shape=input_shape))
    model.add(layers.Dense(64, activation="relu"))
    model.add(layers.Dense(1, dtype="float32"))  # the target normalised, float32 even under mixed precision
    model.add(layers.Rescaling(deviation, offset=mean, dtype="float32", name="label_units"))  # y * std + mean
    model.add(layers.Reshape(()))  # shape (batch,), as the label is stored: no broadcasting in the loss
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=learning_rate),
        loss="mean_squared_error",
        metrics=[keras.metrics.MeanAbsoluteError(name="mae"), keras.metrics.RootMeanSquaredError(name="rmse")],
    )
    return model


def _label_statistics(batches: tf.data.Dataset) -> tuple[float, float]:
    """The labels' mean and standard deviation over (inputs, labels) `batches`, summed in float64 in their order (the
    same on every worker and every start, so a resume rebuilds the same model); a deviation of 0 (one value) is 1."""
    labels = np.concatenate([label.astype(np.float64).reshape(-1) for _, label in batches.as_numpy_iterator()])
    return float(labels.mean()), float(labels.std()) or 1.0


def adapt(context) -> None:
    global NUMBERS
    rows = context.examples(WHOLE_SPLIT)
    label, spec = context.label_key, rows.element_spec
    kinds = {name: _kind(name, each) for name, each in sorted(spec.items()) if name != label}
    numeric = [name for name, kind in kinds.items() if kind != tf.string]
    _columns.update(numbers=numeric, floats=[name for name in numeric if kinds[name].is_floating])
    _label[:] = [label]
    statistics = {name: (0, 0.0, 0.0) for name in numeric}  # count, mean, sum of squared deviations
    values = {name: Counter() for name, kind in kinds.items() if kind == tf.string}
    for batch in rows.as_numpy_iterator():
        for name in numeric:
            statistics[name] = _merged(statistics[name], batch[name].astype(np.float64))
        for name, counts in values.items():
            if len(counts) <= LOOKUP_VALUES:  # past that it is a bag of words: no need to count further
                counts.update(batch[name].tolist())
    NUMBERS = None
    if numeric:
        mean = [statistics[name][1] for name in numeric]
        variance = [statistics[name][2] / max(statistics[name][0], 1) for name in numeric]
        NUMBERS = layers.Normalization(mean=mean, variance=variance)
        NUMBERS.build((None, len(numeric)))
    LOOKUPS.clear()
    BAGS.clear()
    for name, counts in values.items():
        if len(counts) <= LOOKUP_VALUES:  # the most frequent first, ties by value: the same on every worker
            vocabulary = sorted((value for value in counts if value != b"[UNK]"), key=lambda v: (-counts[v], v))
            LOOKUPS[name] = layers.StringLookup(vocabulary=[v.decode() for v in vocabulary], output_mode="one_hot")
        else:
            BAGS[name] = layers.TextVectorization(max_tokens=BAG_TOKENS, output_mode="multi_hot")
            BAGS[name].adapt(rows.map(lambda row, name=name: row[name]))


def _kind(name: str, spec) -> tf.DType:
    """A column's dtype, where it is one number or one text per row (as a table's columns are)."""
    if (
        not isinstance(spec, tf.TensorSpec)
        or spec.shape.rank != 1
        or not (spec.dtype == tf.string or spec.dtype.is_integer or spec.dtype.is_floating)
    ):
        raise ValueError(
            f"examples/mlp_table.py takes a table's columns, each one number or one text a row, but {name!r} is "
            f"{spec}: point MODEL at a model of your own for this data (see examples/tabular_text.py)"
        )
    return spec.dtype


def _merged(statistics: tuple[int, float, float], values: np.ndarray) -> tuple[int, float, float]:
    """(count, mean, sum of squared deviations) with a batch's values added, NaN left out (Chan et al.'s merge)."""
    values = values[~np.isnan(values)]
    if not values.size:
        return statistics
    count, mean, squares = statistics
    batch_mean = float(values.mean())
    batch_squares = float(((values - batch_mean) ** 2).sum())
    total = count + values.size
    delta = batch_mean - mean
    return total, mean + delta * values.size / total, squares + batch_squares + delta**2 * count * values.size / total


def preprocess(example: dict, training: bool, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    del training, seed  # the same in training, evaluation and the export
    parts = []
    if NUMBERS is not None:
        numbers = tf.stack([tf.cast(example[name], tf.float32) for name in _columns["numbers"]])
        missing = tf.math.is_nan(numbers)
        # the layers work on batches: one example goes in as a batch of one, and its one row comes out
        parts.append(tf.where(missing, 0.0, NUMBERS(numbers[None])[0]))  # missing: the train mean, 0 once scaled
        floats = [_columns["numbers"].index(name) for name in _columns["floats"]]
        if floats:
            parts.append(tf.cast(tf.gather(missing, floats), tf.float32))
    parts += [tf.cast(LOOKUPS[name](example[name][None])[0], tf.float32) for name in LOOKUPS]
    parts += [tf.cast(BAGS[name](example[name][None])[0], tf.float32) for name in BAGS]
    if not parts:
        raise ValueError("the table has no column but its label: add a column to learn from")
    return tf.concat(parts, axis=0), example[_label[0]]
