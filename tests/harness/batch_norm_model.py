"""A small MLP with BatchNormalization: on the inputs themselves, then after a hidden layer. HP_MOMENTUM sets both
layers' momentum (0: the moving statistics are the last batch's own). tests/test_statistics.py and the multi-worker
tests train it."""

import keras
from keras import layers


def build_model(input_shape, num_classes, learning_rate, *, momentum: float = 0.9):
    model = keras.Sequential(
        [keras.Input(shape=input_shape), layers.BatchNormalization(momentum=momentum, name="input_norm"),
         layers.Dense(32, activation="relu"), layers.BatchNormalization(momentum=momentum, name="hidden_norm"),
         layers.Dense(num_classes, activation="softmax", dtype="float32")]
    )  # fmt: skip
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=learning_rate),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model
