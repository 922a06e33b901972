"""`synthetic_photos`: RGB images of varying size stored as JPEG in 10 classes, a TFDS builder that needs no
network (the shape of tf_flowers or imagenette, small).

Each image is 40 to 120 pixels high and, independently, as wide. Each class is a hue and a pattern
(stripes, checks, rings, plain) over the whole image, under noise, at a random period and phase; hue,
saturation and value vary per image, so neighbouring classes overlap in colour and only their patterns
tell them apart. A crop of any part of an image, flipped or not, keeps its class, so it suits the
random-resized crops of examples/resnet.py (about 0.9 accuracy in 5 epochs at 64 pixels). Generated
locally and deterministically, stored as TFDS stores photos (JPEG, quality 95), so a model reads the
encoded bytes and decodes what it needs. Importing this module registers it.

    make train MODEL=examples/resnet.py DATASET=synthetic_photos
"""

from __future__ import annotations

import colorsys

import numpy as np
import tensorflow_datasets as tfds

from train.datasets.synthetic import SyntheticBuilder

NUM_CLASSES = 10
SIDES = (40, 120)  # pixels: height and width drawn apart, so the aspect ratio runs from 1:3 to 3:1
PERIOD = (6.0, 14.0)  # pixels per stripe: visible in an 8% crop of the smallest image
NOISE = 20.0  # per pixel and channel, a photo's grain; noise does not compress, so more makes larger JPEGs
HUE_JITTER = 0.6  # of the hue step between classes, either way: more than half, so neighbours overlap
PATTERNS = ("horizontal", "vertical", "checks", "rings", "plain")  # each unchanged in kind by a flip


class SyntheticPhotos(SyntheticBuilder):
    TRAIN_EXAMPLES, TEST_EXAMPLES = 2_048, 512
    SUPERVISED_KEYS = ("image", "label")

    def _features(self) -> tfds.features.FeaturesDict:
        return tfds.features.FeaturesDict(
            {
                "image": tfds.features.Image(shape=(None, None, 3), encoding_format="jpeg"),
                "label": tfds.features.ClassLabel(num_classes=NUM_CLASSES),
            }
        )

    def _generate_examples(self, count: int, seed: int):
        rng = np.random.default_rng(seed)
        for index in range(count):
            label = int(rng.integers(NUM_CLASSES))
            yield index, {"image": _image(label, rng), "label": label}


def _colour(label: int, rng: np.random.Generator) -> np.ndarray:
    """Near the class's hue, 36 degrees from the next class's: drawn so close neighbours overlap in hue, and
    only the pattern tells them apart (the next class's pattern is another)."""
    hue = (label + rng.uniform(-HUE_JITTER, HUE_JITTER)) / NUM_CLASSES
    return 255 * np.array(colorsys.hsv_to_rgb(hue % 1, rng.uniform(0.45, 0.75), rng.uniform(0.6, 0.9)))


def _pattern(kind: str, rows: np.ndarray, columns: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A pattern in [-1, 1] over the pixel grid, at a random period and phase."""
    frequency = 2 * np.pi / rng.uniform(*PERIOD)
    phase = rng.uniform(0, 2 * np.pi)
    if kind == "horizontal":
        return np.sin(rows * frequency + phase)
    if kind == "vertical":
        return np.sin(columns * frequency + phase)
    if kind == "checks":
        return np.sign(np.sin(rows * frequency + phase) * np.sin(columns * frequency + phase))
    if kind == "rings":  # around a random centre, inside the image or not
        centre = rng.uniform(0, 1, size=2) * [rows.shape[0], rows.shape[1]]
        return np.sin(np.hypot(rows - centre[0], columns - centre[1]) * frequency + phase)
    return np.zeros_like(rows, dtype=np.float64)


def _image(label: int, rng: np.random.Generator) -> np.ndarray:
    height, width = rng.integers(SIDES[0], SIDES[1] + 1, size=2)
    rows, columns = np.mgrid[0:height, 0:width]
    pattern = _pattern(PATTERNS[label % len(PATTERNS)], rows, columns, rng)[..., None]
    image = _colour(label, rng) + 35 * pattern + rng.normal(scale=NOISE, size=(height, width, 3))
    return np.clip(image, 0, 255).astype(np.uint8)
