"""The template's offline datasets: TFDS builders that need no network, on one `SyntheticBuilder`.

Each is a subclass of `SyntheticBuilder`: it names its features, its supervised keys and its two splits' sizes,
and generates `count` examples from `seed` (1 for train, 2 for test), deterministically, so the prepared files are
the same on every machine. Its class's docstring is its description. Importing this module registers them all
(train.datasets.registered imports it).

    synthetic_clusters  the default: 32 float features, 10 Gaussian clusters
    synthetic_columns   a table of passengers: columns of different dtypes and a text column
    synthetic_images    32x32x3 PNG images in 10 classes (cifar10's shape)
    synthetic_photos    RGB JPEG images of varying size in 10 classes (tf_flowers' shape, small)
    synthetic_reviews   short texts with a class label (imdb_reviews' kind)
"""

from __future__ import annotations

import abc
import colorsys
import inspect
from typing import ClassVar

import numpy as np
import tensorflow_datasets as tfds


class SyntheticBuilder(tfds.core.GeneratorBasedBuilder, skip_registration=True):
    """A synthetic dataset: "train" and "test" splits of TRAIN_EXAMPLES and TEST_EXAMPLES examples."""

    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES: ClassVar[dict[str, str]] = {"1.0.0": "First release."}
    TRAIN_EXAMPLES: ClassVar[int]
    TEST_EXAMPLES: ClassVar[int]
    SUPERVISED_KEYS: ClassVar[tuple[str, str]]

    @abc.abstractmethod
    def _features(self) -> tfds.features.FeaturesDict:
        """One example's features, as TFDS stores them."""

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(
            description=inspect.cleandoc(type(self).__doc__),
            features=self._features(),
            supervised_keys=self.SUPERVISED_KEYS,
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        del dl_manager  # nothing to download
        return {
            "train": self._generate_examples(self.TRAIN_EXAMPLES, seed=1),
            "test": self._generate_examples(self.TEST_EXAMPLES, seed=2),
        }


# --- synthetic_clusters
NUM_FEATURES = 32  # the documented model's input width
NUM_CLASSES = 10  # synthetic_clusters', synthetic_images' and synthetic_photos'
CENTRE_SPREAD = 0.5  # distance scale between class centres ...
SPREAD_WITHIN = 1.0  # ... against the spread within a class: learnable, but not in one step


class SyntheticClusters(SyntheticBuilder):
    """`synthetic_clusters`: the default dataset, a TFDS builder that needs no network.

    32 float features, 10 classes: each class is a Gaussian cluster around its own centre.
    Generated locally and deterministically (same files on every machine), so `make train`
    works offline and tests know what accuracy to expect.
    """

    TRAIN_EXAMPLES, TEST_EXAMPLES = 16_384, 2_048
    SUPERVISED_KEYS = ("features", "label")

    def _features(self) -> tfds.features.FeaturesDict:
        return tfds.features.FeaturesDict(
            {
                "features": tfds.features.Tensor(shape=(NUM_FEATURES,), dtype=np.float32),
                "label": tfds.features.ClassLabel(num_classes=NUM_CLASSES),
            }
        )

    def _generate_examples(self, count: int, seed: int):
        centres = np.random.default_rng(0).normal(scale=CENTRE_SPREAD, size=(NUM_CLASSES, NUM_FEATURES))
        rng = np.random.default_rng(seed)
        labels = rng.integers(NUM_CLASSES, size=count)
        features = centres[labels] + rng.normal(scale=SPREAD_WITHIN, size=(count, NUM_FEATURES))
        for index in range(count):
            yield index, {"features": features[index].astype(np.float32), "label": int(labels[index])}


# --- synthetic_columns
CLASS_SHARE = (0.25, 0.25, 0.5)  # first, second and third class passengers
CLASS_FARE = (90.0, 25.0, 10.0)  # the median fare of each class
EXIT = (40.0, 0.0)  # metres: passengers within EXIT_REACH of it are likelier to survive
EXIT_REACH = 50.0
PORTS = ("Southampton", "Cherbourg", "Queenstown")  # `embarked`
PORT_SHARE = (0.7, 0.2, 0.1)
CHERBOURG = 0.6  # added to the score of those who embarked there (drawn apart: the other columns are as in 1.0.0)
SCORE_NOISE = 0.35  # logistic scale on the score: the rule alone is right about 93% of the time


class SyntheticColumns(SyntheticBuilder):
    """`synthetic_columns`: a table of passengers, a TFDS builder that needs no network (titanic's kind of data).

    `features` is a FeaturesDict of fixed-shape columns of different dtypes, shapes and scales: `age` (years,
    float32), `fare` (float32, log-normal, 2 to 500), `pclass` (int64, 1 to 3), `sex` (int64, 0 or 1) and
    `position` (float32 (2,), metres along and across the deck). Beside them, `embarked` is the port of
    embarkation as text ("Southampton", "Cherbourg", "Queenstown"), for a model that looks it up
    (examples/tabular_text.py). The label, survived or not, follows a score of all of them (the distance to the
    exit is not linear in `position`) under logistic noise: the rule itself scores about 0.93, a small MLP
    learns 0.85 or more in a few epochs, and about 55% survive. Generated locally and deterministically.

        make train MODEL=examples/tabular.py DATASET=synthetic_columns
        make train MODEL=examples/tabular_text.py DATASET=synthetic_columns
    """

    VERSION = tfds.core.Version("1.1.0")
    RELEASE_NOTES = {"1.0.0": "First release.", "1.1.0": "embarked, a text column."}  # noqa: RUF012 (TFDS reads it)
    TRAIN_EXAMPLES, TEST_EXAMPLES = 4_096, 1_024
    SUPERVISED_KEYS = ("features", "label")

    def _features(self) -> tfds.features.FeaturesDict:
        return tfds.features.FeaturesDict(
            {
                "features": tfds.features.FeaturesDict(
                    {
                        "age": tfds.features.Tensor(shape=(), dtype=np.float32),
                        "fare": tfds.features.Tensor(shape=(), dtype=np.float32),
                        "pclass": tfds.features.Tensor(shape=(), dtype=np.int64),
                        "sex": tfds.features.Tensor(shape=(), dtype=np.int64),
                        "position": tfds.features.Tensor(shape=(2,), dtype=np.float32),
                    }
                ),
                "embarked": tfds.features.Text(),
                "label": tfds.features.ClassLabel(names=["died", "survived"]),
            }
        )

    def _generate_examples(self, count: int, seed: int):
        rng = np.random.default_rng(seed)
        pclass = rng.choice([1, 2, 3], size=count, p=CLASS_SHARE)
        sex = rng.integers(2, size=count)
        age = np.clip(rng.normal(32, 14, size=count), 0.5, 80)
        fare = np.clip(np.exp(rng.normal(np.log(CLASS_FARE)[pclass - 1], 0.5)), 2, 500)
        position = rng.uniform([0, -10], [200, 10], size=(count, 2))
        near_exit = np.hypot(position[:, 0] - EXIT[0], position[:, 1] - EXIT[1]) < EXIT_REACH
        score = 2.2 * sex - 1.1 * (pclass - 2) - 0.06 * (age - 32) + 0.9 * np.log(fare / 25) + 1.6 * near_exit - 1.0
        port = np.random.default_rng(seed + 100).choice(len(PORTS), size=count, p=PORT_SHARE)
        survived = score + CHERBOURG * (port == 1) + rng.logistic(scale=SCORE_NOISE, size=count) > 0
        for index in range(count):
            columns = {
                "age": np.float32(age[index]),
                "fare": np.float32(fare[index]),
                "pclass": np.int64(pclass[index]),
                "sex": np.int64(sex[index]),
                "position": position[index].astype(np.float32),
            }
            yield index, {"features": columns, "embarked": PORTS[port[index]], "label": int(survived[index])}


# --- synthetic_images
SHAPE = (32, 32, 3)


class SyntheticImages(SyntheticBuilder):
    """`synthetic_images`: 32x32x3 images in 10 classes, a TFDS builder that needs no network (cifar10's shape).

    Each class is a colour and a stripe direction, under noise and a random offset: learnable by a small CNN
    in a few epochs, and its classes survive flips and shifts (the CNN example's augmentation). Generated
    locally and deterministically. TFDS stores the images PNG-encoded, as it stores cifar10, so a streamed
    split is decoded while training, as a real image dataset is.

        make train MODEL=examples/cnn.py DATASET=synthetic_images
    """

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


# --- synthetic_photos
SIDES = (40, 120)  # pixels: height and width drawn apart, so the aspect ratio runs from 1:3 to 3:1
PERIOD = (6.0, 14.0)  # pixels per stripe: visible in an 8% crop of the smallest image
GRAIN = 20.0  # per pixel and channel, a photo's grain; noise does not compress, so more makes larger JPEGs
HUE_JITTER = 0.6  # of the hue step between classes, either way: more than half, so neighbours overlap
PATTERNS = ("horizontal", "vertical", "checks", "rings", "plain")  # each unchanged in kind by a flip


class SyntheticPhotos(SyntheticBuilder):
    """`synthetic_photos`: RGB images of varying size stored as JPEG in 10 classes, a TFDS builder that needs no
    network (the shape of tf_flowers or imagenette, small).

    Each image is 40 to 120 pixels high and, independently, as wide. Each class is a hue and a pattern
    (stripes, checks, rings, plain) over the whole image, under noise, at a random period and phase; hue,
    saturation and value vary per image, so neighbouring classes overlap in colour and only their patterns
    tell them apart. A crop of any part of an image, flipped or not, keeps its class, so it suits the
    random-resized crops of examples/resnet.py (about 0.9 accuracy in 5 epochs at 64 pixels). Generated
    locally and deterministically, stored as TFDS stores photos (JPEG, quality 95), so a model reads the
    encoded bytes and decodes what it needs.

        make train MODEL=examples/resnet.py DATASET=synthetic_photos
    """

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
    image = _colour(label, rng) + 35 * pattern + rng.normal(scale=GRAIN, size=(height, width, 3))
    return np.clip(image, 0, 255).astype(np.uint8)


# --- synthetic_reviews
_NEUTRAL = """the a this film movie story plot actor actress scene music it was is and but of to in with very quite
really rather somewhat director camera ending start middle character dialogue script cast show"""
NEUTRAL = tuple(_NEUTRAL.split())
LEANING = (
    ("awful", "boring", "dull", "terrible", "weak", "bad", "tedious", "messy", "bland", "clumsy"),  # negative
    ("great", "superb", "moving", "brilliant", "fine", "good", "lovely", "sharp", "vivid", "clever"),  # positive
)
OWN_SHARE = 0.85  # of the leaning words, the share from the review's own class


class SyntheticReviews(SyntheticBuilder):
    """`synthetic_reviews`: short texts with a class label, a TFDS builder that needs no network (imdb_reviews'
    kind of data: `text`, a tf.string, and `label`, negative or positive).

    Each review is 6 to 24 words drawn from a shared vocabulary of neutral words, with a few words that lean one
    way (about 6 in 7 from its own class's list, the rest from the other's). A bag of words learns about 0.9 in a
    few epochs; no single word decides. Generated locally and deterministically.

        MODEL=examples/text.py DATASET=synthetic_reviews python -m train fit
    """

    TRAIN_EXAMPLES, TEST_EXAMPLES = 4_096, 1_024
    SUPERVISED_KEYS = ("text", "label")

    def _features(self) -> tfds.features.FeaturesDict:
        return tfds.features.FeaturesDict(
            {"text": tfds.features.Text(), "label": tfds.features.ClassLabel(names=["neg", "pos"])}
        )

    def _generate_examples(self, count: int, seed: int):
        rng = np.random.default_rng(seed)
        for index in range(count):
            label = int(rng.integers(2))
            words = list(rng.choice(NEUTRAL, size=int(rng.integers(6, 25))))
            for _ in range(int(rng.integers(2, 5))):  # 2 to 4 leaning words, put anywhere
                side = label if rng.random() < OWN_SHARE else 1 - label
                words.insert(int(rng.integers(len(words) + 1)), str(rng.choice(LEANING[side])))
            yield index, {"text": " ".join(words), "label": label}
