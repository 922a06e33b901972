"""The model: replace this file to train your own.

The contract with the training loop: `build_model` returns a compiled Keras model whose
`optimizer` and `loss` the loop uses; it is called inside the strategy's scope.
"""

from __future__ import annotations

import keras
from keras import layers


def build_model(input_dim: int, num_classes: int, learning_rate: float) -> keras.Model:
    """The documented model: Dense(64, relu) -> Dense(num_classes, softmax), adam, sparse CE, accuracy."""
    model = keras.Sequential(
        [
            keras.Input(shape=(input_dim,)),
            layers.Dense(64, activation="relu"),
            # float32 even under a mixed-precision policy: softmax and the loss need its range and precision.
            layers.Dense(num_classes, activation="softmax", dtype="float32"),
        ],
        name="classifier",
    )
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=learning_rate),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model
