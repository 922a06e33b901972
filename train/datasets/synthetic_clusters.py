"""`synthetic_clusters`: the default dataset, a TFDS builder that needs no network.

32 float features, 10 classes: each class is a Gaussian cluster around its own centre.
Generated locally and deterministically (same files on every machine), so `make train`
works offline and tests know what accuracy to expect. Importing this module registers it.
"""

from __future__ import annotations

import numpy as np
import tensorflow_datasets as tfds

from train.datasets.synthetic import SyntheticBuilder

NUM_FEATURES = 32  # the documented model's input width
NUM_CLASSES = 10
CENTRE_SPREAD = 0.5  # distance scale between class centres ...
NOISE = 1.0  # ... against the spread within a class: learnable, but not in one step


class SyntheticClusters(SyntheticBuilder):
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
        features = centres[labels] + rng.normal(scale=NOISE, size=(count, NUM_FEATURES))
        for index in range(count):
            yield index, {"features": features[index].astype(np.float32), "label": int(labels[index])}
