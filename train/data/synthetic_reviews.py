"""`synthetic_reviews`: short texts with a class label, a TFDS builder that needs no network (imdb_reviews'
kind of data: `text`, a tf.string, and `label`, negative or positive).

Each review is 6 to 24 words drawn from a shared vocabulary of neutral words, with a few words that lean one way
(about 6 in 7 from its own class's list, the rest from the other's). A bag of words learns about 0.9 in a few epochs;
no single word decides. Generated locally and deterministically. Importing this module registers it.

    python -m train fit MODEL=examples/text.py DATASET=synthetic_reviews
"""

from __future__ import annotations

import numpy as np
import tensorflow_datasets as tfds

TRAIN_EXAMPLES = 4_096
TEST_EXAMPLES = 1_024
NEUTRAL = (
    "the", "a", "this", "film", "movie", "story", "plot", "actor", "actress", "scene", "music", "it", "was", "is",
    "and", "but", "of", "to", "in", "with", "very", "quite", "really", "rather", "somewhat", "director", "camera",
    "ending", "start", "middle", "character", "dialogue", "script", "cast", "show",
)  # fmt: skip
LEANING = (
    ("awful", "boring", "dull", "terrible", "weak", "bad", "tedious", "messy", "bland", "clumsy"),  # negative
    ("great", "superb", "moving", "brilliant", "fine", "good", "lovely", "sharp", "vivid", "clever"),  # positive
)
OWN_SHARE = 0.85  # of the leaning words, the share from the review's own class


class SyntheticReviews(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")
    RELEASE_NOTES = {"1.0.0": "First release."}  # noqa: RUF012 (TFDS reads it as a plain class attribute)

    def _info(self) -> tfds.core.DatasetInfo:
        return self.dataset_info_from_configs(
            description=__doc__,
            features=tfds.features.FeaturesDict(
                {"text": tfds.features.Text(), "label": tfds.features.ClassLabel(names=["neg", "pos"])}
            ),
            supervised_keys=("text", "label"),
        )

    def _split_generators(self, dl_manager: tfds.download.DownloadManager):
        del dl_manager  # nothing to download
        return {
            "train": self._generate_examples(TRAIN_EXAMPLES, seed=1),
            "test": self._generate_examples(TEST_EXAMPLES, seed=2),
        }

    def _generate_examples(self, count: int, seed: int):
        rng = np.random.default_rng(seed)
        for index in range(count):
            label = int(rng.integers(2))
            words = list(rng.choice(NEUTRAL, size=int(rng.integers(6, 25))))
            for _ in range(int(rng.integers(2, 5))):  # 2 to 4 leaning words, put anywhere
                side = label if rng.random() < OWN_SHARE else 1 - label
                words.insert(int(rng.integers(len(words) + 1)), str(rng.choice(LEANING[side])))
            yield index, {"text": " ".join(words), "label": label}
