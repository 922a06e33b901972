"""`synthetic_clusters`: the default dataset, a TFDS builder that needs no network.

32 float features, 10 classes: each class is a Gaussian cluster around its own centre.
Generated locally and deterministically (same files on every machine), so `make train`
works offline and tests know what accuracy to expect. Importing this module registers it.
"""

from __future__ import annotations

import numpy as np
import tensorflow_datasets as tfds

NUM_FEATURES = 32  # the documented model's input width
NUM_CLASSES = 10
TRAIN_EXAMPLES = 16_384
TEST_EXAMPLES = 2_048
CENTRE_SPREAD = 0.5  # distance scale between class centres ...
NOISE = 1.0  # ... against the spread within a class: learnable, but not in one step


class SyntheticClusters(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "First release."}  # noqa: RUF012 (TFDS reads it as a plain class attribute)

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(
            description=__doc__,
            features=tfds.features.FeaturesDict(
                {
                    "features": tfds.features.Tensor(shape=(NUM_FEATURES,), dtype=np.float32),
                    "label": tfds.features.ClassLabel(num_classes=NUM_CLASSES),
                }
            ),
            supervised_keys=("features", "label"),
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        del dl_manager  # nothing to download
        return {
            "train": self._generate_examples(TRAIN_EXAMPLES, seed=1),
            "test": self._generate_examples(TEST_EXAMPLES, seed=2),
        }

    def _generate_examples(self, count: int, seed: int):
        centres = np.random.default_rng(0).normal(scale=CENTRE_SPREAD, size=(NUM_CLASSES, NUM_FEATURES))
        rng = np.random.default_rng(seed)
        labels = rng.integers(NUM_CLASSES, size=count)
        features = centres[labels] + rng.normal(scale=NOISE, size=(count, NUM_FEATURES))
        for index in range(count):
            yield index, {"features": features[index].astype(np.float32), "label": int(labels[index])}
