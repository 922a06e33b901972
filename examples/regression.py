"""A regression head: a scalar label that is a value, not a class (TFDS gives num_classes=None).

    make train MODEL=examples/regression.py DATASET=your_dataset LABEL_KEY=price

Mean squared error to train, with mean absolute error and RMSE reported beside the loss (in the progress
lines, TensorBoard and summary.json, under these names).
"""

from __future__ import annotations

import keras
from keras import layers


def build_model(input_shape: tuple[int, ...], num_classes: int | None, learning_rate: float) -> keras.Model:
    if num_classes is not None:
        raise ValueError(f"this model regresses a value; the label is a class label of {num_classes} classes")
    if isinstance(input_shape, dict):  # a table's columns by name
        raise ValueError(
            f"this model takes one tensor, not a table's columns ({', '.join(input_shape)}): for a table, leave MODEL "
            "unset (examples.mlp_table regresses a value label)"
        )
    model = keras.Sequential(name="regressor")
    model.add(keras.Input(shape=input_shape))
    if len(input_shape) > 1:
        model.add(layers.Flatten())
    model.add(layers.Dense(64, activation="relu", kernel_regularizer=keras.regularizers.L2(1e-4)))
    model.add(layers.Dense(1, dtype="float32"))  # one value per example
    model.add(layers.Reshape(()))  # shape (batch,), as the label is stored: no broadcasting in the loss
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=learning_rate, global_clipnorm=1.0),
        loss="mean_squared_error",
        metrics=[keras.metrics.MeanAbsoluteError(name="mae"), keras.metrics.RootMeanSquaredError(name="rmse")],
    )
    return model
