"""The documented MLP with Keras callbacks: early stopping and a learning rate cut on a plateau, and the best
epoch exported (MONITOR):

    make train MODEL=examples/early_stopping.py MONITOR=val_accuracy EPOCHS=30

`build_callbacks(context)` returns the callbacks; the loop calls them as `model.fit` would, on every worker,
and a restart replays the epochs already trained, so a run stopped and resumed stops after the same epoch
as one never stopped (docs/design.md, Callbacks). `model.stop_training` (EarlyStopping's) ends the run with
exit 0, a checkpoint and the export; with MONITOR=val_accuracy, model.keras and saved_model/ hold the best
epoch's weights, and summary.json says which ("best": {"epoch": ..., "step": ..., "val_accuracy": ...}).

A callback of your own that writes files should do it on the chief only (`context.is_chief`), into
`context.output_dir`, and expect on_epoch_end again for the epochs a restart replays.
"""

from __future__ import annotations

import keras
from keras import layers

PATIENCE = 3  # epochs without a better val_accuracy before stopping: a noisy metric gets a few chances
MIN_DELTA = 0.001  # what counts as better: a tenth of a percent of accuracy
LR_FACTOR, LR_PATIENCE = 0.5, 1  # halve the learning rate after one epoch without a lower val_loss


def build_model(
    input_shape: tuple[int, ...], num_classes: int | None, learning_rate: float, *, width: int = 64
) -> keras.Model:
    if num_classes is None:
        raise ValueError("this MLP classifies: for a regression label, point MODEL at examples/regression.py")
    model = keras.Sequential(name="classifier")
    model.add(keras.Input(shape=input_shape))
    if len(input_shape) > 1:
        model.add(layers.Flatten())
    model.add(layers.Dense(width, activation="relu"))
    # float32 even under a mixed-precision policy: softmax and the loss need its range and precision.
    model.add(layers.Dense(num_classes, activation="softmax", dtype="float32"))
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=learning_rate),  # a float: ReduceLROnPlateau can set it
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def build_callbacks(context) -> list[keras.callbacks.Callback]:
    """Called once a start, after build_model, with the run's facts (train.context.Context)."""
    return [
        keras.callbacks.EarlyStopping(monitor="val_accuracy", patience=PATIENCE, min_delta=MIN_DELTA),
        keras.callbacks.ReduceLROnPlateau(monitor="val_loss", factor=LR_FACTOR, patience=LR_PATIENCE),
    ]
