"""A table with a text column: the numbers scaled by a Normalization, the port of embarkation (`embarked`,
a string) one-hot through a StringLookup, both adapted on the raw training rows in `adapt`:

    make train MODEL=examples/tabular_text.py DATASET=synthetic_columns

`adapt(context)` runs once in each process before anything else of this file, on the first ADAPT_EXAMPLES
stored training rows (`context.examples`: the same on every worker and start). `preprocess` then gives the
model two inputs by name, `numbers` and `embarked`, so no string reaches a replica; the export's
`serving_default` takes the stored columns and `embarked` as a string, the lookup inside the SavedModel.
examples/tabular.py is the numbers-only model, which needs no preprocess.
"""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import layers

ADAPT_EXAMPLES = 4096  # training rows the statistics and the vocabulary are learnt from
HIDDEN = (64, 64)  # units of each hidden layer

NUMBERS = layers.Normalization()  # each numeric column to mean 0 and variance 1
PORTS = layers.StringLookup(output_mode="one_hot")  # a port's name to a one-hot vector (an unknown one: its own)


def _numbers(columns: dict) -> tf.Tensor:
    """One example's numeric columns as one float32 vector, in the columns' name order."""
    return tf.concat([tf.reshape(tf.cast(columns[name], tf.float32), [-1]) for name in sorted(columns)], axis=0)


def adapt(context) -> None:
    rows = context.examples(ADAPT_EXAMPLES).unbatch()
    NUMBERS.adapt(rows.map(lambda row: _numbers(row["features"])).batch(256))
    PORTS.adapt(rows.map(lambda row: row["embarked"]).batch(256))


def preprocess(example: dict, training: bool, seed: tf.Tensor) -> tuple[dict, tf.Tensor]:
    del training, seed  # the same in training and evaluation
    # Both layers work on batches: one example goes in as a batch of one, and its one row comes out
    numbers = NUMBERS(_numbers(example["features"])[None])[0]
    inputs = {"numbers": numbers, "embarked": PORTS(example["embarked"][None])[0]}
    return inputs, example["label"]


def build_model(input_shape: dict, num_classes: int | None, learning_rate: float) -> keras.Model:
    if num_classes is None or set(input_shape) != {"numbers", "embarked"}:
        raise ValueError(f"this MLP classifies preprocess's numbers and embarked, not {input_shape}")
    inputs = {name: keras.Input(shape=shape, name=name) for name, shape in input_shape.items()}
    x = layers.Concatenate()([inputs["numbers"], inputs["embarked"]])
    for units in HIDDEN:
        x = layers.Dense(units, activation="relu")(x)
    # float32 even under a mixed-precision policy: softmax and the loss need its range and precision.
    outputs = layers.Dense(num_classes, activation="softmax", dtype="float32")(x)
    model = keras.Model(inputs, outputs, name="tabular_text")
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=learning_rate),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model
