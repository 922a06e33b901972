"""A small ResNet with ImageNet's input recipe, for photos of any size:

    make train MODEL=examples/resnet.py DATASET=synthetic_photos                 # offline, generated here
    make train MODEL=examples/resnet.py DATASET=tf_flowers TRAIN_SPLIT='train[:90%]' EVAL_SPLIT='train[90%:]'
    make train MODEL=examples/resnet.py DATASET=imagenette EVAL_SPLIT=validation
    make train MODEL=examples/resnet.py DATASET=./photos   # your folder: photos/<class>/<file> (docs/data.md)

The same file runs on each once prepared: nothing here names a dataset or a class count, only the keys
`image` and `label` that TFDS's photo datasets use (tf_flowers has one split, hence the two slices).

`preprocess` turns one stored example into what the model sees, IMAGE_SIZE x IMAGE_SIZE x 3 in uint8:
- training: a random-resized crop (8% to 100% of the area, aspect 3:4 to 4:3), resized, flipped at random.
  For a JPEG only the crop's window is decoded (`decode_and_crop_jpeg`); other images are decoded whole.
- evaluation and serving: the centre square of CROP_FRACTION of the shorter side, resized.
Every draw is a stateless op keyed on the engine's per-example `seed`, so a crop is the same under a
parallel map and after a resume. The image stays uint8 (a quarter of float32's bytes through the input
pipeline and onto the device), and the model scales it to [0, 1] in its first layer, in the export too.
"""

from __future__ import annotations

from collections.abc import Callable

import keras
import tensorflow as tf
from keras import layers

IMAGE_SIZE = 64  # pixels a side, what the model sees; ImageNet's recipe uses 224
CROP_FRACTION = 0.875  # evaluation's centre crop, of the shorter side: ImageNet's 224 of 256
AREA_RANGE = (0.08, 1.0)  # of the image, a training crop's area
ASPECT_RATIO_RANGE = (3 / 4, 4 / 3)  # a training crop's width / height
MAX_ATTEMPTS = 10  # crops drawn before the whole image is used instead (a long thin image may fit none)
WIDTHS = (16, 32, 64)  # channels of each stage; each stage after the first halves the resolution
BLOCKS_PER_STAGE = 1
BATCH_NORM_MOMENTUM = 0.9  # flax's and tensorflow/models' ResNets: Keras's 0.99 forgets its initial statistics slowly


def preprocess(example: dict, training: bool, seed: tf.Tensor) -> tuple[tf.Tensor, tf.Tensor]:
    """One stored example (`image`, `image_bytes`, `label`) -> (uint8 image, label), as the engine's seam."""
    if training:
        crop_seed, flip_seed = tf.unstack(tf.random.experimental.stateless_split(seed, num=2))
        image = _resize(_crop(example, lambda shape: _random_window(shape, crop_seed)))
        image = tf.image.stateless_random_flip_left_right(image, flip_seed)
    else:
        image = _resize(_crop(example, _centre_window))
    return image, example["label"]


def _crop(example: dict, window_of: Callable[[tf.Tensor], tf.Tensor]) -> tf.Tensor:
    """The window `window_of(shape)` picks, as uint8 (h, w, 3): a JPEG decodes only it, read from the bytes;
    another image is cut from its decoded pixels.

    One tf.cond, each branch all of its own way from shape to pixels: TensorFlow then runs the engine's full
    decode (`example["image"]`) only for an image that is not a JPEG. Measured: a window computed outside
    and fed to the cond, or a second cond for the shape, and every JPEG is decoded whole as well."""
    data = example["image_bytes"]

    def jpeg() -> tf.Tensor:
        return tf.image.decode_and_crop_jpeg(data, window_of(tf.image.extract_jpeg_shape(data)), channels=3)

    def decoded() -> tf.Tensor:
        image = _rgb(example["image"])
        top, left, height, width = tf.unstack(window_of(tf.shape(image)))
        return image[top : top + height, left : left + width]

    return tf.cond(tf.io.is_jpeg(data), jpeg, decoded)


def _random_window(shape: tf.Tensor, seed: tf.Tensor) -> tf.Tensor:
    """[top, left, height, width] of a random-resized crop of an image of `shape` (height, width, channels)."""
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        shape,
        bounding_boxes=tf.zeros([1, 0, 4]),  # none: the whole image is the box ...
        seed=seed,
        min_object_covered=0.0,  # ... and AREA_RANGE alone bounds the crop (the default 0.1 would raise 0.08)
        aspect_ratio_range=ASPECT_RATIO_RANGE,
        area_range=AREA_RANGE,
        max_attempts=MAX_ATTEMPTS,
        use_image_if_no_bounding_boxes=True,
    )
    return tf.stack([begin[0], begin[1], size[0], size[1]])


def _centre_window(shape: tf.Tensor) -> tf.Tensor:
    """[top, left, height, width] of the centre square of CROP_FRACTION of the shorter side (flax's rounding)."""
    height, width = shape[0], shape[1]
    side = tf.cast(CROP_FRACTION * tf.cast(tf.minimum(height, width), tf.float32), tf.int32)
    return tf.stack([(height - side + 1) // 2, (width - side + 1) // 2, side, side])


def _rgb(image: tf.Tensor) -> tf.Tensor:
    """Three channels, as a JPEG decodes with channels=3: grey repeated, alpha dropped."""
    channels = image.shape[-1]
    if channels == 1:
        return tf.image.grayscale_to_rgb(image)
    return image[..., :3] if channels == 4 else image


def _resize(image: tf.Tensor) -> tf.Tensor:
    """IMAGE_SIZE x IMAGE_SIZE, back in uint8: one resize for training and evaluation alike."""
    # antialias: a photo's crop is often several times IMAGE_SIZE, and shrinks without aliasing only with it.
    resized = tf.image.resize(image, [IMAGE_SIZE, IMAGE_SIZE], method="bilinear", antialias=True)
    return tf.saturate_cast(tf.round(resized), tf.uint8)


def build_model(input_shape: tuple[int, ...], num_classes: int | None, learning_rate: float) -> keras.Model:
    if num_classes is None or len(input_shape) != 3:
        raise ValueError(
            f"this ResNet classifies images (height, width, channels), not {input_shape} into {num_classes}"
        )
    inputs = keras.Input(shape=input_shape, dtype="uint8", name="image")  # as preprocess returns it
    x = layers.Rescaling(1 / 255)(inputs)  # to [0, 1], in the compute dtype (bfloat16 under mixed precision)
    # ImageNet's stem shrinks 4x (7x7 stride 2, then a max-pool); at 64 pixels one stride-2 3x3 conv, 2x.
    x = _conv_bn(x, WIDTHS[0], 3, strides=2)
    x = layers.ReLU()(x)
    for stage, width in enumerate(WIDTHS):
        for block in range(BLOCKS_PER_STAGE):
            x = _residual_block(x, width, strides=2 if stage > 0 and block == 0 else 1)
    x = layers.GlobalAveragePooling2D()(x)
    # float32 even under a mixed-precision policy: softmax and the loss need its range and precision.
    outputs = layers.Dense(num_classes, activation="softmax", dtype="float32")(x)
    model = keras.Model(inputs, outputs, name="resnet")
    model.compile(
        optimizer=keras.optimizers.Adam(learning_rate=learning_rate),
        loss="sparse_categorical_crossentropy",
        metrics=["accuracy"],
    )
    return model


def _conv_bn(x, width: int, kernel: int, strides: int = 1, zero_gamma: bool = False):
    # No bias: the BatchNormalization after it has one.
    x = layers.Conv2D(width, kernel, strides=strides, padding="same", use_bias=False)(x)
    gamma = "zeros" if zero_gamma else "ones"
    return layers.BatchNormalization(momentum=BATCH_NORM_MOMENTUM, gamma_initializer=gamma)(x)


def _residual_block(x, width: int, strides: int):
    """ResNet's basic block: two 3x3 convs, added to the input (projected by a 1x1 conv where the shape changes)."""
    shortcut = x if strides == 1 and x.shape[-1] == width else _conv_bn(x, width, 1, strides=strides)
    y = layers.ReLU()(_conv_bn(x, width, 3, strides=strides))
    y = _conv_bn(y, width, 3, zero_gamma=True)  # each block starts as the identity: deep nets train from step one
    return layers.ReLU()(layers.Add()([shortcut, y]))
