"""A model with its own `train_step`, as the Keras guide "Customizing what happens in fit()" writes it, plus one
metric of its own (the gradients' norm): the engine calls this step on every replica, as `model.fit` would.

    make train MODEL=examples/custom_step.py
    make train MODEL=examples/custom_step.py CPU_DEVICES=2

What changes with a step of your own (docs/design.md, "A model's own train_step"): the optimizer sums the
replicas' gradients inside `apply`, as in Keras, so its clipping (clipnorm, global_clipnorm) clips each
replica's gradients before their sum; the dict the step returns is what the run logs, averaged over the
replicas as `fit` averages it. A class the model file defines is registered as serializable, so `model.keras`
loads (`evaluate --exported` imports this file first).
"""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import layers


@keras.saving.register_keras_serializable(package="custom_step")
class CustomModel(keras.Model):
    """The guide's override: the compiled loss and metrics, and a gradient norm of its own."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.gradient_norm = keras.metrics.Mean(name="gradient_norm")

    def train_step(self, data):
        x, y = data
        with tf.GradientTape() as tape:
            y_pred = self(x, training=True)
            loss = self.compute_loss(y=y, y_pred=y_pred)
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(gradients, self.trainable_variables)
        self.gradient_norm.update_state(tf.linalg.global_norm(gradients))
        for metric in self.metrics:
            if metric.name == "loss":
                metric.update_state(loss)
            elif metric.name != "gradient_norm":
                metric.update_state(y, y_pred)
        return {metric.name: metric.result() for metric in self.metrics}


def build_model(input_shape: tuple[int, ...], num_classes: int | None, learning_rate: float) -> keras.Model:
    if num_classes is None:
        raise ValueError("this example classifies: point DATASET at a dataset of class labels")
    inputs = keras.Input(shape=input_shape)
    hidden = layers.Flatten()(inputs) if len(input_shape) > 1 else inputs
    hidden = layers.Dense(64, activation="relu")(hidden)
    outputs = layers.Dense(num_classes, activation="softmax", dtype="float32")(hidden)
    model = CustomModel(inputs, outputs, name="custom_step")
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=learning_rate),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model
