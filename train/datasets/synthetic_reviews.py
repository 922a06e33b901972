"""`synthetic_reviews`: short texts with a class label, a TFDS builder that needs no network (imdb_reviews'
kind of data: `text`, a tf.string, and `label`, negative or positive).

Each review is 6 to 24 words drawn from a shared vocabulary of neutral words, with a few words that lean one way
(about 6 in 7 from its own class's list, the rest from the other's). A bag of words learns about 0.9 in a few epochs;
no single word decides. Generated locally and deterministically. Importing this module registers it.

    MODEL=examples/text.py DATASET=synthetic_reviews python -m train fit
"""

from __future__ import annotations

import numpy as np
import tensorflow_datasets as tfds

from train.datasets.synthetic import SyntheticBuilder

_NEUTRAL = """the a this film movie story plot actor actress scene music it was is and but of to in with very quite
really rather somewhat director camera ending start middle character dialogue script cast show"""
NEUTRAL = tuple(_NEUTRAL.split())
LEANING = (
    ("awful", "boring", "dull", "terrible", "weak", "bad", "tedious", "messy", "bland", "clumsy"),  # negative
    ("great", "superb", "moving", "brilliant", "fine", "good", "lovely", "sharp", "vivid", "clever"),  # positive
)
OWN_SHARE = 0.85  # of the leaning words, the share from the review's own class


class SyntheticReviews(SyntheticBuilder):
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
