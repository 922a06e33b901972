"""The documented MLP with a bug planted: a layer whose integer counter grows by the worker's index + 1 at every
training step, so that the workers end with different weights (tests/test_multi_worker.py). An integer state is
never averaged over the replicas (as the seed generators' states are not)."""

import json
import os

import keras
from keras import layers


@keras.saving.register_keras_serializable(package="tests")
class Drift(layers.Layer):
    def build(self, input_shape):
        self.count = self.add_weight(shape=(), dtype="int32", initializer="zeros", trainable=False, name="count")

    def call(self, inputs, training=False):
        if training:
            task = json.loads(os.environ.get("TF_CONFIG") or "{}").get("task", {})
            self.count.assign_add(int(task.get("index", 0)) + 1)
        return inputs


def build_model(input_shape, num_classes, learning_rate):
    model = keras.Sequential(
        [keras.Input(shape=input_shape), Drift(), layers.Dense(16, activation="relu"),
         layers.Dense(num_classes, activation="softmax", dtype="float32")]
    )  # fmt: skip
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss="sparse_categorical_crossentropy")
    return model
