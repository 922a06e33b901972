"""A small CNN with augmentation for 32x32x3 images (cifar10), its learning rate warmed up then decayed:

    make train MODEL=examples/cnn.py DATASET=cifar10
    make train MODEL=examples/cnn.py DATASET=cifar10 HP_WIDTH=64    # twice the filters

The images arrive as the dataset stores them, (32, 32, 3), scaled to [0, 1] by the engine (a TFDS image's
uint8 values), so the model starts at its convolutions. Augmentation is Keras preprocessing layers inside
the model: active in training only, and each replica draws its own flips and shifts, reproducibly from SEED
(their state is in every checkpoint, so a resumed run draws what an uninterrupted one would).

`width` is a hyperparameter: a keyword-only parameter with a default is the setting HP_WIDTH, recorded in
settings.json and TensorBoard's HParams. `context` is the run's facts: the schedule needs its total steps
(EPOCHS x steps per epoch), as flax's `create_learning_rate_fn` does. The optimizer's step counter is in every
checkpoint, so a resumed run continues the schedule where it stopped.
"""

from __future__ import annotations

import keras
from keras import layers

# Warm up over this share of the run's steps, from 0 to LEARNING_RATE, then a cosine decay to 0: the large first
# updates of a fresh model at the full rate are what the warmup avoids (flax's imagenet: 5 of 100 epochs).
WARMUP_SHARE = 0.05


def build_model(
    input_shape: tuple[int, ...], num_classes: int | None, learning_rate: float, *, width: int = 32, context
) -> keras.Model:
    if num_classes is None or len(input_shape) != 3:
        raise ValueError(f"this CNN classifies images (height, width, channels), not {input_shape} into {num_classes}")
    model = keras.Sequential(
        [
            keras.Input(shape=input_shape),
            layers.RandomFlip("horizontal"),
            layers.RandomTranslation(0.1, 0.1, fill_mode="nearest"),
            layers.Conv2D(width, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.Conv2D(2 * width, 3, padding="same", activation="relu"),
            layers.MaxPooling2D(),
            layers.GlobalAveragePooling2D(),
            layers.Dropout(0.2),
            # float32 even under a mixed-precision policy: softmax and the loss need its range and precision.
            layers.Dense(num_classes, activation="softmax", dtype="float32"),
        ],
        name="cnn",
    )
    warmup = max(1, round(WARMUP_SHARE * context.total_steps))
    schedule = keras.optimizers.schedules.CosineDecay(
        initial_learning_rate=0.0,
        warmup_target=learning_rate,
        warmup_steps=warmup,
        decay_steps=max(1, context.total_steps - warmup),
    )
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=schedule),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy", keras.metrics.SparseTopKCategoricalAccuracy(k=3, name="top3_accuracy")],
    )
    return model
