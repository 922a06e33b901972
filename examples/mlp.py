"""The documented model, the default MODEL: Dense(64, relu) -> Dense(num_classes, softmax), adam, sparse
categorical cross-entropy, accuracy.

Every model file keeps one contract with the engine: a `build_model(input_shape, num_classes, learning_rate)`
that returns a compiled `keras.Model`. The engine calls it inside the distribution strategy's scope, trains
with what `compile` was given (loss, loss_weights, regularisation, every metric) and exports the model with
the input scaling in front of it. `input_shape` is the feature's shape as the dataset stores it, e.g. (32,)
or (28, 28, 1); `num_classes` is the class count of a class label, k for a (k,) multi-hot label, and None for
a scalar label that is not a class (regression).
"""

from __future__ import annotations

import keras
from keras import layers


def build_model(input_shape: tuple[int, ...], num_classes: int | None, learning_rate: float) -> keras.Model:
    if isinstance(input_shape, dict):  # a table's columns by name, or a preprocess's dict
        raise ValueError(
            f"the documented model takes one tensor, not a dict of inputs ({', '.join(input_shape)}): point MODEL "
            "at a model that takes them, like examples/tabular.py (a CSV or JSON Lines DATASET: MODEL unset, or "
            "examples.mlp_table, prepares every column for this model)"
        )
    if num_classes is None:
        raise ValueError(
            "the documented model classifies, and this label is not a class label (a TFDS ClassLabel): point MODEL "
            "at a model for it, like examples/regression.py (a CSV or JSON Lines DATASET: MODEL and FEATURE_KEY "
            "unset, examples.mlp_table regresses a value label)"
        )
    model = keras.Sequential(name="classifier")
    model.add(keras.Input(shape=input_shape))
    if len(input_shape) > 1:  # an image or any feature with more than one axis
        model.add(layers.Flatten())
    model.add(layers.Dense(64, activation="relu"))
    # float32 even under a mixed-precision policy: softmax and the loss need its range and precision.
    model.add(layers.Dense(num_classes, activation="softmax", dtype="float32"))
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=learning_rate),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model
