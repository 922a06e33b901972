"""Fine-tune a pretrained image backbone on your photos, in the two phases of the keras.io transfer-learning guide:
the backbone frozen while a new head learns, then everything at a learning rate 100x lower.

    make setup EXTRAS=dev,hub                                                   # KerasHub, from the locks
    make train MODEL=examples/finetune.py DATASET=./photos HP_PRESET=./presets/resnet_18  # a preset's folder
    make train MODEL=examples/finetune.py DATASET=./photos HP_PRESET=resnet_18_imagenet   # or a kaggle:// handle
    make train MODEL=examples/finetune.py DATASET=./photos HP_WEIGHTS=~/.keras/models/mobilenet_v2_..._no_top.h5

The backbone comes from one of two places, and nothing downloads at run time (docs/fork.md, Pretrained backbones):
- `HP_PRESET`: a KerasHub preset, its folder or its name in the kagglehub cache (KAGGLEHUB_CACHE, default
  ~/.cache/kagglehub), found by the engine's `train.presets.resolve_preset`, as INIT_FROM finds one. Its backbone
  is loaded by KerasHub (`Backbone.from_preset`) and kept as plain Keras layers, so model.keras loads without it.
- `HP_WEIGHTS`: a `keras.applications` weights file (MobileNetV2, ALPHA wide, without its top): the `.h5` that
  `weights="imagenet"` fetches into KERAS_HOME/models, or any file `load_weights` reads.

The recipe (keras.io, "Transfer learning & fine-tuning"): `phases()` (train.Phase) holds the two phases,
`HP_HEAD_EPOCHS` epochs with only the head training at LEARNING_RATE, then every layer at
`HP_FINE_TUNE_LEARNING_RATE` to the run's end; each phase starts with fresh optimizer slots, as a recompile does.
The guide keeps the backbone's BatchNormalization in inference mode once it trains, by calling it with
`training=False`; in Keras 3 a functional model called with `training=True` passes that on to every layer inside
it, over the `training=False` it was built with (keras-team/keras#20285), and the statistics would move. Here
build_model freezes the BatchNormalization layers instead (a layer build_model froze stays frozen in every
phase): a frozen one runs in inference mode, its statistics and scale stay the pretrained ones.
`import keras_hub` happens inside `_preset_backbone` only: without HP_PRESET the hub extra is not needed.
"""

from __future__ import annotations

import keras
import tensorflow as tf
from keras import layers

import train

IMAGE_SIZE = 160  # pixels a side; keras.applications' MobileNetV2 has weights for 96, 128, 160, 192 and 224
ALPHA = 0.35  # MobileNetV2's width for HP_WEIGHTS: the weights file must be of this width (0.35 to 1.4)
DROPOUT = 0.2  # before the head, as in the guide


def preprocess(example: dict, training: bool, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """One stored image of any size and format -> IMAGE_SIZE x IMAGE_SIZE x 3 uint8, flipped at random in training."""
    image = tf.io.decode_image(example["image_bytes"], channels=3, expand_animations=False)
    image = tf.image.resize(image, [IMAGE_SIZE, IMAGE_SIZE], antialias=True)
    if training:
        image = tf.image.stateless_random_flip_left_right(image, seed)
    return tf.saturate_cast(tf.round(image), tf.uint8), example["label"]


def build_model(
    input_shape: tuple[int, ...], num_classes: int | None, learning_rate: float, *, preset: str = "", weights: str = ""
) -> keras.Model:
    if num_classes is None or len(input_shape) != 3:
        raise ValueError(f"this model classifies images (height, width, channels), not {input_shape}")
    if bool(preset) == bool(weights):
        raise ValueError(f"HP_PRESET={preset!r}, HP_WEIGHTS={weights!r}: set one, a KerasHub preset or an .h5 file")
    scaling, backbone = _preset_backbone(preset) if preset else _application(weights, input_shape)
    inputs = keras.Input(shape=input_shape, dtype="uint8", name="image")  # as preprocess returns it
    for layer in _nested(backbone):  # frozen from the start, so in inference mode in every phase: see the docstring
        layer.trainable = layer.trainable and not isinstance(layer, layers.BatchNormalization)
    x = backbone(scaling(inputs))
    x = layers.GlobalAveragePooling2D()(x)
    x = layers.Dropout(DROPOUT)(x)
    # float32 even under a mixed-precision policy: softmax and the loss need its range and precision.
    outputs = layers.Dense(num_classes, activation="softmax", dtype="float32", name="head")(x)
    model = keras.Model(inputs, outputs, name="finetune")
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=learning_rate),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def phases(context, *, head_epochs: int = 2, fine_tune_learning_rate: float = 1e-5) -> list[train.Phase]:
    """The guide's two phases: the head alone (the backbone frozen) at LEARNING_RATE, then everything."""
    return [
        train.Phase(head_epochs, trainable="head"),
        train.Phase(1, trainable="all", learning_rate=fine_tune_learning_rate),  # the last lasts to the end
    ]


def _nested(layer: keras.layers.Layer) -> list[keras.layers.Layer]:
    """Every layer inside `layer`, at any depth."""
    inner = getattr(layer, "layers", [])
    return [each for child in inner for each in (child, *_nested(child))]


def _preset_backbone(preset: str) -> tuple[layers.Rescaling, keras.Model]:
    """The preset's input scaling and its backbone with its weights, as a plain functional model of its layers."""
    import keras_hub  # the hub extra's: imported only when a preset is asked for

    from train.presets import resolve_preset  # a folder, or a name in KAGGLEHUB_CACHE; never a download

    folder = resolve_preset(preset)
    backbone = keras_hub.models.Backbone.from_preset(str(folder))
    scaling = layers.Rescaling(1 / 127.5, offset=-1, name="scaling")  # to [-1, 1], where the preset does not say
    if (folder / "image_converter.json").is_file():  # how the preset's images were scaled (per channel, often)
        converter = keras_hub.layers.ImageConverter.from_preset(str(folder))
        scaling = layers.Rescaling(converter.scale or 1.0, offset=converter.offset or 0.0, name="scaling")
    return scaling, keras.Model(backbone.input, backbone.output, name="backbone")


def _application(weights: str, input_shape: tuple[int, ...]) -> tuple[layers.Rescaling, keras.Model]:
    """keras.applications' MobileNetV2 without its top, its weights from the local file `weights`; it takes [-1, 1]."""
    backbone = keras.applications.MobileNetV2(
        input_shape=input_shape, alpha=ALPHA, include_top=False, weights=weights, name="backbone"
    )
    return layers.Rescaling(1 / 127.5, offset=-1, name="scaling"), backbone
