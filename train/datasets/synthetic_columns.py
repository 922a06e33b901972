"""`synthetic_columns`: a table of passengers, a TFDS builder that needs no network (titanic's kind of data).

`features` is a FeaturesDict of fixed-shape columns of different dtypes, shapes and scales: `age` (years,
float32), `fare` (float32, log-normal, 2 to 500), `pclass` (int64, 1 to 3), `sex` (int64, 0 or 1) and
`position` (float32 (2,), metres along and across the deck). Beside them, `embarked` is the port of
embarkation as text ("Southampton", "Cherbourg", "Queenstown"), for a model that looks it up
(examples/tabular_text.py). The label, survived or not, follows a score of all of them (the distance to the
exit is not linear in `position`) under logistic noise: the rule itself scores about 0.93, a small MLP
learns 0.85 or more in a few epochs, and about 55% survive. Generated locally and deterministically.
Importing this module registers it.

    make train MODEL=examples/tabular.py DATASET=synthetic_columns
    make train MODEL=examples/tabular_text.py DATASET=synthetic_columns
"""

from __future__ import annotations

import numpy as np
import tensorflow_datasets as tfds

from train.datasets.synthetic import SyntheticBuilder

CLASS_SHARE = (0.25, 0.25, 0.5)  # first, second and third class passengers
CLASS_FARE = (90.0, 25.0, 10.0)  # the median fare of each class
EXIT = (40.0, 0.0)  # metres: passengers within EXIT_REACH of it are likelier to survive
EXIT_REACH = 50.0
PORTS = ("Southampton", "Cherbourg", "Queenstown")  # `embarked`
PORT_SHARE = (0.7, 0.2, 0.1)
CHERBOURG = 0.6  # added to the score of those who embarked there (drawn apart: the other columns are as in 1.0.0)
NOISE = 0.35  # logistic scale on the score: the rule alone is right about 93% of the time


class SyntheticColumns(SyntheticBuilder):
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
        survived = score + CHERBOURG * (port == 1) + rng.logistic(scale=NOISE, size=count) > 0
        for index in range(count):
            columns = {
                "age": np.float32(age[index]),
                "fare": np.float32(fare[index]),
                "pclass": np.int64(pclass[index]),
                "sex": np.int64(sex[index]),
                "position": position[index].astype(np.float32),
            }
            yield index, {"features": columns, "embarked": PORTS[port[index]], "label": int(survived[index])}
