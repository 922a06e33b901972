"""The documented MLP with a top-k metric, compiled with the optimizer options in TEST_OPTIMIZER (JSON), e.g.
{"global_clipnorm": 0.1}: one model, one set of options at a time (tests/test_replicas.py)."""

import json
import os

import keras
from keras import layers


def build_model(input_shape, num_classes, learning_rate):
    options = json.loads(os.environ.get("TEST_OPTIMIZER") or "{}")
    optimizer = keras.optimizers.get({"class_name": options.pop("class_name", "Adam"),
                                      "config": {"learning_rate": learning_rate, **options}})  # fmt: skip
    model = keras.Sequential(
        [keras.Input(shape=input_shape), layers.Dense(64, activation="relu"),
         layers.Dense(num_classes, activation="softmax", dtype="float32")]
    )  # fmt: skip
    model.compile(
        optimizer=optimizer,
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=3, name="top3")],
    )
    return model
