"""A multi-label head: a (k,) multi-hot label, each of k classes present or not (TFDS gives num_classes=k).

Sigmoid outputs and binary cross-entropy; a per-class F1 score is reported as a list (in summary.json).
"""

from __future__ import annotations

import keras
from keras import layers


def build_model(input_shape: tuple[int, ...], num_classes: int | None, learning_rate: float) -> keras.Model:
    if num_classes is None:
        raise ValueError("this model predicts a multi-hot vector; the label is a scalar value")
    model = keras.Sequential(name="multilabel")
    model.add(keras.Input(shape=input_shape))
    if len(input_shape) > 1:
        model.add(layers.Flatten())
    model.add(layers.Dense(64, activation="relu"))
    model.add(layers.Dense(num_classes, activation="sigmoid", dtype="float32"))
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=learning_rate),
        loss="binary_crossentropy",
        metrics=[
            keras.metrics.BinaryAccuracy(name="binary_accuracy"),
            keras.metrics.F1Score(average=None, threshold=0.5, name="f1"),
        ],
    )
    return model
