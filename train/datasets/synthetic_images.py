"""`synthetic_images`: 32x32x3 images in 10 classes, a TFDS builder that needs no network (cifar10's shape).

Each class is a colour and a stripe direction, under noise and a random offset: learnable by a small CNN
in a few epochs, and its classes survive flips and shifts (the CNN example's augmentation). Generated
locally and deterministically. TFDS stores the images PNG-encoded, as it stores cifar10, so a streamed
split is decoded while training, as a real image dataset is. Importing this module registers it.

    make train MODEL=examples/cnn.py DATASET=synthetic_images
"""

from __future__ import annotations

import numpy as np
import tensorflow_datasets as tfds

from train.datasets.synthetic import SyntheticBuilder

SHAPE = (32, 32, 3)
NUM_CLASSES = 10


class SyntheticImages(SyntheticBuilder):
    TRAIN_EXAMPLES, TEST_EXAMPLES = 8_192, 1_024
    SUPERVISED_KEYS = ("image", "label")

    def _features(self) -> tfds.features.FeaturesDict:
        return tfds.features.FeaturesDict(
            {"image": tfds.features.Image(shape=SHAPE), "label": tfds.features.ClassLabel(num_classes=NUM_CLASSES)}
        )

    def _generate_examples(self, count: int, seed: int):
        palette = np.random.default_rng(0).uniform(70, 185, size=(NUM_CLASSES, 3))
        rows, columns = np.mgrid[0 : SHAPE[0], 0 : SHAPE[1]]
        rng = np.random.default_rng(seed)
        for index in range(count):
            label = int(rng.integers(NUM_CLASSES))
            angle = np.pi * label / NUM_CLASSES  # each class its own stripe direction
            phase = rng.uniform(0, 2 * np.pi)  # and a random offset
            stripes = np.sin((rows * np.cos(angle) + columns * np.sin(angle)) / 2.0 + phase)[..., None]
            image = palette[label] + 30 * stripes + rng.normal(scale=60, size=SHAPE)
            yield index, {"image": np.clip(image, 0, 255).astype(np.uint8), "label": label}
