"""The fork contract (tests/test_project.py) is right for every kind of feature the engine trains on: a fork that
trains, exports and serves passes it, and one that does not fails it with the engine's one line first. The forks
are written here, each MODEL file with its own TFDS builder (registered when the file loads), nothing prepared."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import REPO
from tests.harness.contract_run import failure, outcome, run_contract

TEXT_DATASET = '''
import tensorflow_datasets as tfds

class ContractTexts(tfds.core.GeneratorBasedBuilder):
    """Reviews: a Text feature and a ClassLabel."""
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return self.dataset_info_from_configs(
            features=tfds.features.FeaturesDict(
                {"text": tfds.features.Text(), "label": tfds.features.ClassLabel(names=["negative", "positive"])}),
            supervised_keys=("text", "label"))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(32), "test": self._generate_examples(8)}

    def _generate_examples(self, count):
        for index in range(count):
            yield index, {"text": "a good film" if index % 2 else "a bad film", "label": index % 2}
'''

TEXT_FORK = """
import keras, tensorflow as tf

BUCKETS = 64

def preprocess(example, training, seed):
    words = tf.strings.split(tf.strings.lower(example["text"]))
    return tf.reduce_sum(tf.one_hot(tf.strings.to_hash_bucket_fast(words, BUCKETS), BUCKETS), axis=0), example["label"]

def build_model(input_shape, num_classes, learning_rate):
    model = keras.Sequential([keras.Input(input_shape), keras.layers.Dense(num_classes, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model
"""

# A table read from a CSV file beside the model file: numeric columns and a text one, the inputs a dict by name.
CSV_DATASET = """
import csv
from pathlib import Path
import numpy as np, tensorflow_datasets as tfds

class ContractRows(tfds.core.GeneratorBasedBuilder):
    VERSION = tfds.core.Version("1.0.0")

    def _info(self):
        return self.dataset_info_from_configs(features=tfds.features.FeaturesDict({
            "age": tfds.features.Tensor(shape=(), dtype=np.float32),
            "fare": tfds.features.Tensor(shape=(), dtype=np.float32),
            "city": tfds.features.Text(),
            "survived": tfds.features.ClassLabel(names=["no", "yes"]),
        }))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples()}

    def _generate_examples(self):
        with open(Path(__file__).parent.with_name("rows.csv"), newline="") as stream:
            for index, row in enumerate(csv.DictReader(stream)):
                yield index, {"age": float(row["age"]), "fare": float(row["fare"]), "city": row["city"],
                              "survived": int(row["survived"])}
"""

CSV_FORK = """
import keras, tensorflow as tf

def preprocess(example, training, seed):
    city = tf.one_hot(tf.strings.to_hash_bucket_fast(example["city"], 16), 16)
    numbers = tf.stack([example["age"] / 100.0, example["fare"] / 100.0])
    return {"numbers": numbers, "city": city}, example["survived"]

def build_model(input_shape, num_classes, learning_rate):
    numbers = keras.Input(input_shape["numbers"], name="numbers")
    city = keras.Input(input_shape["city"], name="city")
    hidden = keras.layers.Dense(8, activation="relu")(keras.layers.Concatenate()([numbers, city]))
    scores = keras.layers.Dense(num_classes, activation="softmax")(hidden)
    model = keras.Model({"numbers": numbers, "city": city}, scores)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model
"""


def fork(tmp_path: Path, name: str, source: str, dataset: str) -> dict[str, str]:
    """The fork's MODEL file, and its builder in a package of its own (TFDS wants a builder's module in one), as a
    fork's project/datasets.py is: the MODEL file imports it, which registers the builder."""
    (tmp_path / "fork_datasets").mkdir()
    (tmp_path / "fork_datasets" / "__init__.py").write_text(dataset)
    (tmp_path / name).write_text("import fork_datasets  # registers the builder\n" + source)
    return {
        "MODEL": str(tmp_path / name),
        "TFDS_DATA_DIR": str(tmp_path / "unprepared"),
        "PYTHONPATH": f"{REPO}:{tmp_path}",
    }


def test_a_text_fork_passes_the_contract_serving_its_strings(tmp_path):
    settings = fork(tmp_path, "texts.py", TEXT_FORK, TEXT_DATASET)
    result = run_contract(tmp_path / "export", DATASET="contract_texts", **settings)
    assert result.returncode == 0, failure(result)
    found = outcome(result)
    assert found["loss_finite"] and found["saved_model"], found
    assert found["served_default_shape"] == [8, 2] and found["served_outputs"] == ["classes", "scores"]


def test_a_csv_fork_of_numbers_and_text_passes_the_contract(tmp_path):
    (tmp_path / "rows.csv").write_text("age,fare,city,survived\n22,7.25,Southampton,0\n38,71.3,Cherbourg,1\n")
    settings = fork(tmp_path, "rows.py", CSV_FORK, CSV_DATASET)
    result = run_contract(tmp_path / "export", DATASET="contract_rows", LABEL_KEY="survived", **settings)
    assert result.returncode == 0, failure(result)
    assert outcome(result)["served_default_shape"] == [8, 2]


def test_a_fork_of_dict_columns_passes_the_contract(tmp_path):
    result = run_contract(tmp_path / "export", MODEL="examples.tabular", DATASET="synthetic_columns",
                          TFDS_DATA_DIR=str(tmp_path / "unprepared"))  # fmt: skip
    assert result.returncode == 0, failure(result)
    assert outcome(result)["served_default_shape"] == [8, 2]


def test_a_fork_the_engine_refuses_fails_the_contract_with_the_engines_one_line_first(tmp_path):
    returned = next(line for line in TEXT_FORK.splitlines() if line.startswith("    return tf.reduce_sum("))
    broken = TEXT_FORK.replace(returned, '    return example["text"], example["label"]  # the string, undecoded')
    settings = fork(tmp_path, "broken.py", broken, TEXT_DATASET)
    result = run_contract(tmp_path / "export", DATASET="contract_texts", **settings)
    assert result.returncode == 2
    assert failure(result).splitlines()[0] == (
        f"error: MODEL={settings['MODEL']!r}: preprocess(training=True) returns inputs as strings (shape ()): a model "
        "input must be numeric (decode it in preprocess; strings cannot be copied to a GPU replica)"
    )
    assert "Traceback" not in result.stderr
