"""A small model in two parts, for the phases' tests (tests/test_phases.py): a backbone (`backbone_dense`,
`backbone_norm`) and a `head`. HP_SCHEDULE=true gives Adam an ExponentialDecay schedule from LEARNING_RATE."""

import keras
from keras import layers


def build_model(input_shape, num_classes, learning_rate, *, schedule: bool = False):
    model = keras.Sequential(
        [keras.Input(shape=input_shape), layers.Dense(16, activation="relu", name="backbone_dense"),
         layers.BatchNormalization(name="backbone_norm"),
         layers.Dense(num_classes, activation="softmax", name="head", dtype="float32")]
    )  # fmt: skip
    rate = keras.optimizers.schedules.ExponentialDecay(learning_rate, 10, 0.5) if schedule else learning_rate
    model.compile(optimizer=keras.optimizers.Adam(rate), loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model
