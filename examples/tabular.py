"""An MLP over a table's columns, one named input each (titanic's kind of data):

    make train MODEL=examples/tabular.py DATASET=synthetic_columns
    make train MODEL=examples/tabular.py DATASET=./table.csv   # a CSV of numbers, a header row (docs/data.md)

No `preprocess`: the engine gives a FeaturesDict of fixed-shape columns to the model as a dict, one entry
per column under its own name, and `input_shape` is the dict of their shapes, e.g. {"age": (), "position":
(2,)}. The model builds one `keras.Input` per entry from that dict, so any table of numeric columns fits.
Every column enters as float32 (Keras casts an int64 column on the way in), flattened, all side by side.

The columns are on different scales (a fare in hundreds beside a 0/1 column): a Normalization layer scales
them to mean 0 and variance 1, with the mean and variance of the first training rows, `context.sample`. That
sample is the same on every worker and every start, so the layer is the same wherever it is built (its mean
and variance are in the checkpoint and the export too).
"""

from __future__ import annotations

import math

import keras
from keras import layers, ops

HIDDEN = (64, 64)  # units of each hidden layer
SAMPLE = 4096  # training rows the Normalization learns its mean and variance from: ample for a few columns


def build_model(
    input_shape: dict[str, tuple[int, ...]], num_classes: int | None, learning_rate: float, *, context
) -> keras.Model:
    if num_classes is None or not isinstance(input_shape, dict):
        raise ValueError(f"this MLP classifies a dict of columns (name -> shape), not {input_shape} into {num_classes}")

    def joined(columns):  # one flat vector per column, () -> (1,) and (2,) -> (2,), then all of them side by side
        flat = [ops.reshape(ops.cast(columns[name], "float32"), (-1, math.prod(shape))) for name, shape in
                input_shape.items()]  # fmt: skip
        return ops.concatenate(flat, axis=-1)

    normalize = layers.Normalization()
    normalize.adapt(context.sample(SAMPLE).map(joined))  # batches of the columns as the model gets them
    inputs = {name: keras.Input(shape=shape, name=name) for name, shape in input_shape.items()}
    flat = [layers.Reshape((math.prod(shape),))(inputs[name]) for name, shape in input_shape.items()]
    x = normalize(layers.Concatenate()(flat) if len(flat) > 1 else flat[0])
    for units in HIDDEN:
        x = layers.Dense(units, activation="relu")(x)
    # float32 even under a mixed-precision policy: softmax and the loss need its range and precision.
    outputs = layers.Dense(num_classes, activation="softmax", dtype="float32")(x)
    model = keras.Model(inputs, outputs, name="tabular")
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=learning_rate),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model
