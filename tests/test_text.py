"""Text and vocabularies: MODEL's `adapt(context)` fits the layers `preprocess` uses on the raw training texts,
the same on 1 device, 2 replicas and 2 workers; run.json records what it fitted and a start that fits other
state is refused; the SavedModel takes the raw strings, the vocabulary inside it; and what would fail at the
export fails before the first step. Real `python -m train` processes on CPU, on synthetic_reviews."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, kill_mid_run, read_summary, run_python, run_train, same_weights, start_train
from tests.harness.runs import run_two_workers
from train.agreement import reconcile, report
from train.data.adapt import difference
from train.errors import SettingsError

TEXT = {
    "MODEL": str(REPO / "examples" / "text.py"), "DATASET": "synthetic_reviews", "TRAIN_SPLIT": "train[:1024]",
    "EVAL_SPLIT": "test", "EPOCHS": 2, "STEPS_PER_CALL": 4, "CHECKPOINT_EVERY": 8, "LEARNING_RATE": 0.003,
}  # fmt: skip
GLOBAL_BATCH = 32

# The SavedModel fed what a client has: the split's stored texts as strings, through serving_default.
SERVED_ACCURACY = """
import json, sys
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds
import train.datasets.synthetic

data_dir, name, split, saved_model = sys.argv[1:5]
serve = tf.saved_model.load(saved_model).signatures["serving_default"]
inputs = serve.structured_input_signature[1]
right = total = 0
for batch in tfds.builder(name, data_dir=data_dir).as_dataset(split=split).batch(100):
    sent = {key: batch[key] if key in batch else batch["features"][key] for key in inputs}  # a column by its name
    predicted = np.argmax(serve(**sent)["scores"].numpy(), axis=-1)
    right, total = right + int(np.sum(predicted == batch["label"].numpy())), total + len(predicted)
print(json.dumps({"inputs": {key: spec.dtype.name for key, spec in inputs.items()}, "accuracy": right / total}))
"""


def served_accuracy(data_dir: Path, run: Path, name: str = "synthetic_reviews", split: str = "test") -> dict:
    result = run_python(["-c", SERVED_ACCURACY, str(data_dir), name, split, str(run / "saved_model")])
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def text_settings(data_dir: Path, output_dir: Path, replicas: int = 1, **more: object) -> dict[str, object]:
    return {**TEXT, "TFDS_DATA_DIR": data_dir, "OUTPUT_DIR": output_dir, "CPU_DEVICES": replicas,
            "BATCH_SIZE": GLOBAL_BATCH // replicas, **more}  # fmt: skip


def error_line(result: subprocess.CompletedProcess) -> str:
    """The one line a refusal prints (TensorFlow's C++ start-up lines come before it)."""
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    line = result.stderr.strip().splitlines()[-1]
    assert line.startswith("error: "), result.stderr[-3000:]
    return line


def adapted(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())["adapted"]


@pytest.fixture(scope="module")
def text_one(tmp_path_factory, text_data_dir):
    """examples/text.py trained start to end on one device: the reference for the tests below."""
    output_dir = tmp_path_factory.mktemp("text1") / "run"
    result = run_train("fit", cwd=output_dir.parent, **text_settings(text_data_dir, output_dir))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return output_dir


def test_the_text_example_serves_raw_strings_with_the_vocabulary_inside_matching_evaluation(text_one, text_data_dir):
    summary = read_summary(text_one)
    assert summary["eval"]["accuracy"] > 0.8, summary["eval"]  # chance is 0.5
    vocabulary = adapted(text_one)["VOCABULARY"]
    assert vocabulary["layer"] == "TextVectorization" and vocabulary["vocabulary"]["size"] > 40
    served = served_accuracy(text_data_dir, text_one)
    assert served["inputs"] == {"text": "string"}  # the stored strings, under the feature's own name
    assert abs(served["accuracy"] - summary["eval"]["accuracy"]) <= 0.005


def test_the_tabular_text_example_looks_up_its_text_column_and_serves_it_as_strings(tmp_path, photos_data_dir):
    run = tmp_path / "run"
    result = run_train("fit", cwd=tmp_path, MODEL=REPO / "examples" / "tabular_text.py", DATASET="synthetic_columns",
                       TFDS_DATA_DIR=photos_data_dir, OUTPUT_DIR=run, EPOCHS=3, BATCH_SIZE=64,
                       LEARNING_RATE=0.003)  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    summary = read_summary(run)
    assert summary["eval"]["accuracy"] > 0.8, summary["eval"]
    state = adapted(run)
    assert state["PORTS"]["vocabulary"]["size"] == 4  # three ports and the out-of-vocabulary entry
    assert len(state["NUMBERS"]["mean"]) == 6  # age, fare, pclass, position (2), sex
    served = served_accuracy(photos_data_dir, run, "synthetic_columns")
    assert served["inputs"]["embarked"] == "string" and "fare" in served["inputs"]
    assert abs(served["accuracy"] - summary["eval"]["accuracy"]) <= 0.005


@pytest.mark.slow
def test_two_replicas_adapt_the_same_vocabulary(text_one, tmp_path, text_data_dir):
    run = tmp_path / "run"
    result = run_train("fit", cwd=tmp_path, **text_settings(text_data_dir, run, replicas=2))
    assert result.returncode == 0, result.stderr[-3000:]
    assert adapted(run) == adapted(text_one)
    assert read_summary(run)["replicas"] == 2


@pytest.mark.slow
def test_two_workers_adapt_the_same_vocabulary_as_one_device(text_one, tmp_path, text_data_dir):
    run = tmp_path / "run"
    settings = text_settings(text_data_dir, run, replicas=2) | {"CPU_DEVICES": None}  # 1 device on each worker
    workers = run_two_workers(tmp_path, tmp_path, timeout=240, TMPDIR=tmp_path, **settings)
    assert [code for code, _ in workers] == [0, 0], workers[0][1][-4000:] + workers[1][1][-2000:]
    assert adapted(run) == adapted(text_one)
    assert read_summary(run)["workers"] == 2


@pytest.mark.slow
def test_a_text_run_killed_mid_run_resumes_to_the_weights_of_the_uninterrupted_run(text_one, tmp_path, text_data_dir):
    run = tmp_path / "run"
    settings = text_settings(text_data_dir, run)
    process = start_train("fit", cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **settings)
    kill_mid_run(process, run)
    result = run_train("fit", cwd=tmp_path, **settings)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(run)
    assert summary["resumed_from_step"] > 0
    assert summary["weights_sha256"] == read_summary(text_one)["weights_sha256"]
    assert same_weights(run / "model.keras", text_one / "model.keras")


def test_a_start_whose_adapt_fits_another_vocabulary_is_refused_in_one_line(text_one, tmp_path, text_data_dir):
    run = tmp_path / "run"
    run.mkdir()
    for name in ("run.json", "settings.json"):  # the reference run's record, its checkpoints not needed
        (run / name).write_text((text_one / name).read_text())
    result = run_train("fit", cwd=tmp_path, **text_settings(text_data_dir, run, TRAIN_SPLIT="train[:2]"))
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-2000:]
    line = error_line(result)
    assert "VOCABULARY (TextVectorization) has another vocabulary" in line and "training data" in line
    assert not (run / "checkpoints").exists()


def test_evaluate_adapts_again_and_refuses_other_vocabularies_than_the_runs(text_one, tmp_path):
    expected = read_summary(text_one)["eval"]["accuracy"]
    for args in (["evaluate"], ["evaluate", "--exported"]):
        result = run_train(*args, "--output-dir", str(text_one), cwd=tmp_path, MODEL=None)
        assert result.returncode == 0, result.stderr[-3000:]
        report = json.loads(result.stdout[result.stdout.index("{") :])
        assert report["accuracy"] == pytest.approx(expected, abs=1e-6), args
    other = run_train("evaluate", "--output-dir", str(text_one), cwd=tmp_path, MODEL=None, TRAIN_SPLIT="train[:2]")
    assert other.returncode == 2, other.stderr[-3000:]
    assert "VOCABULARY (TextVectorization) has another vocabulary" in error_line(other)


@pytest.mark.parametrize(
    ("adapt", "said"),
    [
        ("def adapt(context):\n    context.examples(10).map(lambda e: e['colour'])",
         "adapt(context) raised KeyError"),
        ("adapt = 3", "adapt is a int, not a function: define adapt(context)"),
    ],
    ids=["raises", "not-a-function"],
)  # fmt: skip
def test_an_adapt_that_fails_is_one_line_and_exit_2(tmp_path, text_data_dir, adapt, said):
    model = tmp_path / "model.py"
    model.write_text(FIXED_LOOKUP + "\n" + adapt + "\n")
    result = run_train("fit", cwd=tmp_path, **text_settings(text_data_dir, tmp_path / "run", MODEL=model))
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-3000:]
    assert said in error_line(result)
    assert not (tmp_path / "run").exists()


def test_float_statistics_agree_within_rtol_and_vocabularies_exactly():
    norm = {"NORM": {"layer": "Normalization", "mean": [1.0, 2.0], "variance": [3.0, 4.0]}}
    assert difference(norm, {"NORM": {**norm["NORM"], "mean": [1.0 + 1e-9, 2.0]}}) is None
    assert "another mean" in difference(norm, {"NORM": {**norm["NORM"], "mean": [1.001, 2.0]}})
    vocab = {"V": {"layer": "StringLookup", "vocabulary": {"size": 3, "sha256": "a" * 64}}}
    assert "another vocabulary" in difference(vocab, {"V": {**vocab["V"], "vocabulary": {"size": 3, "sha256": "b"}}})


def test_workers_whose_adapt_differs_from_the_chiefs_are_refused_before_training():
    reports = [report({}, "m", {}, True, "float32", {}, {"V": {"layer": "StringLookup", "vocabulary": {
        "size": size, "sha256": str(size)}}}) for size in (3, 4)]  # fmt: skip
    with pytest.raises(SettingsError, match=r"worker 1 .*adapt gave other state on worker 1 .*V \(StringLookup\)"):
        reconcile(reports)


# A module-level StringLookup with a fixed vocabulary: tracked by the export (before, its table was "untracked").
FIXED_LOOKUP = """
import keras, tensorflow as tf

WORDS = keras.layers.StringLookup(vocabulary=["awful", "boring", "dull", "great", "superb", "moving"])

def preprocess(example, training, seed):
    ids = WORDS(tf.strings.split(example["text"]))
    counts = tf.math.bincount(tf.cast(ids, tf.int32), minlength=7, maxlength=7, dtype=tf.float32)
    return tf.ensure_shape(counts, [7]), example["label"]

def build_model(input_shape, num_classes, learning_rate):
    inputs = keras.Input(input_shape, name="inputs")
    model = keras.Model(inputs, keras.layers.Dense(num_classes, activation="softmax")(inputs))
    model.compile(keras.optimizers.Adam(learning_rate), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model
"""


def test_a_module_level_string_lookup_is_exported_and_served_on_raw_strings(tmp_path, text_data_dir):
    model = tmp_path / "lookup.py"
    model.write_text(FIXED_LOOKUP)
    run = tmp_path / "run"
    result = run_train("fit", cwd=tmp_path, **text_settings(text_data_dir, run, MODEL=model, LEARNING_RATE=0.05))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    summary = read_summary(run)
    assert adapted(run)["WORDS"]["vocabulary"]["size"] == 7  # the out-of-vocabulary entry and the six words
    served = served_accuracy(text_data_dir, run)
    assert served["inputs"] == {"text": "string"}
    assert abs(served["accuracy"] - summary["eval"]["accuracy"]) <= 0.005


# Each model below trained to the end on the code before the export was tried first, then failed at the export
# (a traceback labelled "This is a bug", or the untracked-resource assertion): now one line, exit 2, no step.
SUBCLASSED = """
import keras

class Classifier(keras.Model):
    def __init__(self, classes):
        super().__init__()
        self.head = keras.layers.Dense(classes, activation="softmax")

    def call(self, inputs):
        return self.head(inputs)

def build_model(input_shape, num_classes, learning_rate):
    model = Classifier(num_classes)
    model.compile(keras.optimizers.Adam(learning_rate), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model
"""
LAMBDA = """
import keras

def build_model(input_shape, num_classes, learning_rate):
    inputs = keras.Input(input_shape)
    doubled = keras.layers.Lambda(lambda x: x * 2.0)(inputs)
    model = keras.Model(inputs, keras.layers.Dense(num_classes, activation="softmax")(doubled))
    model.compile(keras.optimizers.Adam(learning_rate), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model
"""
CLOSURE_TABLE = """
import keras, tensorflow as tf

def _made():
    table = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(["great", "awful"], [1, 2]), 0)

    def preprocess(example, training, seed):
        ids = table.lookup(tf.strings.split(example["text"]))
        counts = tf.math.bincount(ids, minlength=3, maxlength=3, dtype=tf.float32)
        return tf.ensure_shape(counts, [3]), example["label"]

    return preprocess

preprocess = _made()

def build_model(input_shape, num_classes, learning_rate):
    inputs = keras.Input(input_shape, name="inputs")
    model = keras.Model(inputs, keras.layers.Dense(num_classes, activation="softmax")(inputs))
    model.compile(keras.optimizers.Adam(learning_rate), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model
"""


@pytest.mark.parametrize(
    ("source", "dataset", "said"),
    [
        (SUBCLASSED, "synthetic_clusters", "cannot be saved as model.keras (NotImplementedError"),
        (LAMBDA, "synthetic_clusters", "cannot be loaded back with safe_mode"),
        (CLOSURE_TABLE, "synthetic_reviews", "the SavedModel cannot carry a resource preprocess uses"),
    ],
    ids=["subclassed-without-get_config", "lambda-layer", "table-in-a-closure"],
)
def test_a_model_the_export_would_fail_on_is_refused_before_the_first_step(
    tmp_path, tfds_data_dir, text_data_dir, source, dataset, said
):
    model = tmp_path / "model.py"
    model.write_text(source)
    data_dir = text_data_dir if dataset == "synthetic_reviews" else tfds_data_dir
    result = run_train("fit", cwd=tmp_path, MODEL=model, DATASET=dataset, TFDS_DATA_DIR=data_dir,
                       OUTPUT_DIR=tmp_path / "run", EPOCHS=1, BATCH_SIZE=32)  # fmt: skip
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-3000:]
    line = error_line(result)
    assert "This is a bug" not in line, line
    assert said in line, line
    assert "Training " not in result.stdout and not (tmp_path / "run" / "checkpoints").exists()


# --- preprocess's outputs of unknown static dimensions ----------------------------------------------------------

# ImageNet's crop: a window of the image's own size, resized to 32x32. Its static shape is (32, 32, None).
CROP = """
import keras, tensorflow as tf

def preprocess(example, training, seed):
    image = example["image"]
    begin, size, _ = tf.image.stateless_sample_distorted_bounding_box(
        tf.shape(image), tf.zeros([0, 0, 4]), seed=seed, min_object_covered=0.1, use_image_if_no_bounding_boxes=True)
    return tf.image.resize(tf.slice(image, begin, size), (32, 32)), example["label"]

def build_model(input_shape, num_classes, learning_rate):
    inputs = keras.Input(input_shape, name="inputs")
    outputs = keras.layers.Dense(num_classes, activation="softmax")(keras.layers.GlobalAveragePooling2D()(inputs))
    model = keras.Model(inputs, outputs)
    model.compile(keras.optimizers.Adam(learning_rate), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model
"""
# A vector of WIDTH zeros, one longer for a text of more than LONGEST words: odd where the first examples are not.
WORDS_WIDE = """
import keras, tensorflow as tf

def preprocess(example, training, seed):
    words = tf.size(tf.strings.split(example["text"]))
    return tf.zeros(tf.where(words > LONGEST, 5, 4)[None]), example["label"]

def build_model(input_shape, num_classes, learning_rate):
    inputs = keras.Input(input_shape, name="inputs")
    model = keras.Model(inputs, keras.layers.Dense(num_classes, activation="softmax")(inputs))
    model.compile(keras.optimizers.Adam(learning_rate), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model
"""
WORD_COUNTS = """
import json, sys, tensorflow as tf, tensorflow_datasets as tfds, train.datasets.synthetic
config = tfds.ReadConfig(interleave_cycle_length=1)
texts = tfds.builder("synthetic_reviews", data_dir=sys.argv[1]).as_dataset(split="train", read_config=config)
print(json.dumps([len(example["text"].numpy().split()) for example in texts.take(1024)]))
"""


def test_an_output_of_unknown_dimensions_is_taken_at_the_first_examples_shape_and_trains(tmp_path, photos_data_dir):
    model = tmp_path / "crop.py"
    model.write_text(CROP)
    result = run_train("fit", cwd=tmp_path, MODEL=model, DATASET="synthetic_photos", TFDS_DATA_DIR=photos_data_dir,
                       TRAIN_SPLIT="train[:128]", EVAL_SPLIT="test[:64]", OUTPUT_DIR=tmp_path / "run", EPOCHS=1,
                       BATCH_SIZE=32)  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "preprocess returns (32, 32, None); the first examples give (32, 32, 3): taken as fixed" in result.stdout
    assert read_summary(tmp_path / "run")["steps"] == 4


def test_a_later_example_of_another_shape_stops_the_run_in_one_line(tmp_path, text_data_dir):
    counts = json.loads(run_python(["-c", WORD_COUNTS, str(text_data_dir)]).stdout.strip().splitlines()[-1])
    longest = max(counts[:32])  # what the first examples give: 4 wide; a longer text later is 5 wide
    assert any(count > longest for count in counts[32:]), "no later text is longer: the test cannot tell"
    model = tmp_path / "wide.py"
    model.write_text(WORDS_WIDE.replace("LONGEST", str(longest)))
    result = run_train("fit", cwd=tmp_path, **text_settings(text_data_dir, tmp_path / "run", MODEL=model))
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
    assert "preprocess returns (None,); the first examples give (4,): taken as fixed" in result.stdout
    line = error_line(result)
    assert "preprocess returned (5,) for an example of synthetic_reviews" in line, line
    assert "where the first examples gave (4,)" in line and "is intact" in line, line


def test_a_dimension_that_differs_among_the_first_examples_is_refused_as_variable(tmp_path, text_data_dir):
    model = tmp_path / "ragged.py"
    model.write_text(WORDS_WIDE.replace("tf.where(words > LONGEST, 5, 4)[None]", "words[None]"))
    result = run_train("fit", cwd=tmp_path, **text_settings(text_data_dir, tmp_path / "run", MODEL=model))
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-3000:]
    assert "returns inputs of variable shape (None): every output needs a fixed shape" in error_line(result)


# Each kind of preprocessing layer the issue names, adapted or given, and a tf.lookup table: what the fingerprint
# says of each, made twice from the same data (the same) and once from other data (not).
KINDS = """
import json, types
import numpy as np, keras, tensorflow as tf
from train.data.adapt import difference, fingerprint, resources

def module(values):
    made = types.ModuleType("fork")
    made.BINS = keras.layers.Discretization(num_bins=4)
    made.BINS.adapt(np.array(values, np.float32))
    made.IDS = keras.layers.IntegerLookup()
    made.IDS.adapt(np.array(values, np.int64) % 7)
    made.NORM = keras.layers.Normalization()
    made.NORM.adapt(np.array(values, np.float32)[:, None])
    made.LAYERS = [keras.layers.Hashing(num_bins=8), keras.layers.StringLookup(vocabulary=["a", "b"])]
    made.TABLE = tf.lookup.StaticHashTable(tf.lookup.KeyValueTensorInitializer(["a"], [1]), 0)
    return made

first, again, other = (fingerprint(resources(module(v))) for v in ([1, 2, 3, 5, 8, 13], [1, 2, 3, 5, 8, 13], [1, 2]))
print(json.dumps({"found": sorted(resources(module([1, 2]))), "kinds": {k: sorted(v) for k, v in first.items()},
                  "same": difference(first, again), "other": difference(first, other)}))
"""


def test_each_preprocessing_layer_and_table_is_found_and_fingerprinted():
    result = run_python(["-c", KINDS])
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    assert found["found"] == ["BINS", "IDS", "LAYERS[0]", "LAYERS[1]", "NORM", "TABLE"]
    assert found["kinds"] == {
        "BINS": ["bins", "layer"], "IDS": ["layer", "vocabulary"], "LAYERS[1]": ["layer", "vocabulary"],
        "NORM": ["layer", "mean", "variance"],
    }  # fmt: skip
    assert found["same"] is None
    assert found["other"].startswith("BINS (Discretization) has another bins")
