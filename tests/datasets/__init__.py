"""Datasets the tests generate locally (TFDS builders; importing this package registers them).

    synthetic_values  8 float features and a float32 value: a regression label (num_classes None)
    synthetic_tags    16 float features and a (5,) multi-hot label (num_classes 5)
    synthetic_sketches  8x8x1 images without a label (LABEL_KEY=none)

The template's own offline datasets (synthetic_clusters, synthetic_images, ...) live in train/datasets/synthetic.py.
"""

from __future__ import annotations

import numpy as np
import tensorflow_datasets as tfds

FEATURES = 8


class SyntheticValues(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict(
                {
                    "features": tfds.features.Tensor(shape=(FEATURES,), dtype=np.float32),
                    "value": tfds.features.Scalar(dtype=np.float32),
                }
            ),
            supervised_keys=("features", "value"),
        )

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(2048, seed=1), "test": self._generate_examples(512, seed=2)}

    def _generate_examples(self, count, seed):
        weights = np.random.default_rng(0).normal(size=FEATURES)
        rng = np.random.default_rng(seed)
        for index in range(count):
            features = rng.normal(size=FEATURES).astype(np.float32)
            value = float(features @ weights + np.sin(features[0]) + rng.normal(scale=0.1))
            yield index, {"features": features, "value": np.float32(value)}


class SyntheticTags(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict(
                {
                    "features": tfds.features.Tensor(shape=(16,), dtype=np.float32),
                    "tags": tfds.features.Tensor(shape=(5,), dtype=np.int64),
                }
            ),
            supervised_keys=("features", "tags"),
        )

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(2048, seed=1), "test": self._generate_examples(512, seed=2)}

    def _generate_examples(self, count, seed):
        directions = np.random.default_rng(0).normal(size=(5, 16))
        rng = np.random.default_rng(seed)
        for index in range(count):
            features = rng.normal(size=16).astype(np.float32)
            yield index, {"features": features, "tags": (directions @ features > 0.5).astype(np.int64)}


class WideValues(tfds.core.GeneratorBasedBuilder):
    """4,000 x 16,384 float32 features (262 MB) in 10 classes: big enough to measure what holding it costs."""

    VERSION = tfds.core.Version("1.0.0")
    WIDTH, TRAIN, TEST = 16_384, 4_000, 250

    def _info(self):
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict(
                {
                    # stored as raw bytes: written (and read) ~10x faster than a list of 16,384 floats
                    "features": tfds.features.Tensor(
                        shape=(self.WIDTH,), dtype=np.float32, encoding=tfds.features.Encoding.BYTES
                    ),
                    "label": tfds.features.ClassLabel(num_classes=10),
                }
            ),
            supervised_keys=("features", "label"),
        )

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(self.TRAIN, 1), "test": self._generate_examples(self.TEST, 2)}

    def _generate_examples(self, count, seed):
        rng = np.random.default_rng(seed)
        block = rng.normal(size=(256, self.WIDTH)).astype(np.float32)  # reused rows: generating is not the point
        for index in range(count):
            yield index, {"features": block[index % 256], "label": index % 10}


class SyntheticSketches(tfds.core.GeneratorBasedBuilder):
    """8x8x1 uint8 images and nothing else: data without a label (LABEL_KEY=none), like a GAN's."""

    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict({"image": tfds.features.Image(shape=(8, 8, 1))}),
        )

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(96, seed=1), "test": self._generate_examples(16, seed=2)}

    def _generate_examples(self, count, seed):
        rng = np.random.default_rng(seed)
        rows = np.arange(8)[:, None, None]
        for index in range(count):
            yield index, {"image": ((rows * 32 + rng.integers(0, 16, (8, 8, 1))) % 256).astype(np.uint8)}
