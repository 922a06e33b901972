"""The bundled offline datasets' one builder: what every `synthetic_*` dataset shares.

Each is a TFDS builder that needs no network: a subclass of `SyntheticBuilder` names its features, its
supervised keys and its two splits' sizes, and generates `count` examples from `seed` (1 for train, 2 for
test), deterministically, so the prepared files are the same on every machine. Its module's docstring is
its description. Importing a subclass's module registers it (train.datasets.registered imports them all).
"""

from __future__ import annotations

import abc
import sys
from typing import ClassVar

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
            description=sys.modules[type(self).__module__].__doc__,
            features=self._features(),
            supervised_keys=self.SUPERVISED_KEYS,
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        del dl_manager  # nothing to download
        return {
            "train": self._generate_examples(self.TRAIN_EXAMPLES, seed=1),
            "test": self._generate_examples(self.TEST_EXAMPLES, seed=2),
        }
