"""A small CNN with augmentation for 32x32x3 images (cifar10):

    make train MODEL=examples/cnn.py DATASET=cifar10

The images arrive as the dataset stores them, (32, 32, 3), scaled to [0, 1] by the engine (a TFDS image's
uint8 values), so the model starts at its convolutions. Augmentation is Keras preprocessing layers inside
the model: active in training only, and each replica draws its own flips and shifts, reproducibly from SEED
(their state is in every checkpoint, so a resumed run draws what an uninterrupted one would).
"""

from __future__ import annotations

import keras
from keras import layers


def build_model(input_shape: tuple[int, ...], num_classes: int | None, learning_rate: float) -> keras.Model:
    if num_classes is None or len(input_shape) != 3:
        raise ValueError(f"this CNN classifies images (height, width, channels), not {input_shape} into {num_classes}")
    model = keras.Sequential(
        [
            keras.Input(shape=input_shape),
            layers.RandomFlip("horizontal"),
            layers.RandomTranslation(0.1, 0.1, fill_mode="nearest"),
            layers.Conv2D(32, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(64, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.GlobalAveragePooling2D(),
            layers.Dropout(0.2),
            # float32 even under a mixed-precision policy: softmax and the loss need its range and precision.
            layers.Dense(num_classes, activation="softmax", dtype="float32"),
        ],
        name="cnn",
    )
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=learning_rate),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=3, name="top3_accuracy")],
    )
    return model
