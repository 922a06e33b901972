"""The examples a fork starts from, trained offline for real: the CNN with augmentation and dropout on
32x32x3 images (synthetic_images, PNG-encoded as TFDS stores cifar10), a regression head and a multi-label
head. Each run is a real `python -m train` process on CPU, on 1 and 2 replicas."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import (
    REPO,
    kill_mid_run,
    read_summary,
    run_python,
    run_train,
    same_weights,
    start_train,
    tensorboard_events,
)

CNN = {
    "MODEL": str(REPO / "examples" / "cnn.py"),  # the path form, as `make train MODEL=examples/cnn.py` gives it
    "DATASET": "synthetic_images", "TRAIN_SPLIT": "train[:1024]", "EVAL_SPLIT": "test[:256]", "EPOCHS": 2,
    "STEPS_PER_CALL": 4, "CHECKPOINT_EVERY": 8, "LOG_EVERY": 16, "LEARNING_RATE": 0.003,
}  # fmt: skip
GLOBAL_BATCH = 32


def cnn_settings(data_dir: Path, output_dir: Path, replicas: int) -> dict[str, object]:
    return {**CNN, "TFDS_DATA_DIR": data_dir, "OUTPUT_DIR": output_dir, "CPU_DEVICES": replicas,
            "BATCH_SIZE": GLOBAL_BATCH // replicas, "JIT_COMPILE": None}  # fmt: skip


def train_cnn(tmp_path_factory, data_dir: Path, replicas: int) -> tuple[int, Path, subprocess.CompletedProcess]:
    output_dir = tmp_path_factory.mktemp(f"cnn{replicas}") / "run"
    result = run_train("fit", cwd=output_dir.parent, **cnn_settings(data_dir, output_dir, replicas))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return replicas, output_dir, result


@pytest.fixture(scope="module")
def cnn_one(tmp_path_factory, examples_data_dir):
    """The CNN trained start to end on one replica: the reference for the tests below."""
    return train_cnn(tmp_path_factory, examples_data_dir, 1)


@pytest.fixture(scope="module")
def cnn_two(tmp_path_factory, examples_data_dir):
    """... and on 2 replicas (logical CPUs)."""
    return train_cnn(tmp_path_factory, examples_data_dir, 2)


@pytest.fixture(params=[1, 2], ids=["1 replica", "2 replicas"])
def cnn_run(request):
    return request.getfixturevalue("cnn_one" if request.param == 1 else "cnn_two")


def test_the_cnn_trains_on_images_in_their_shape_with_every_compiled_metric(cnn_run):
    replicas, run, result = cnn_run
    summary = read_summary(run)
    assert (summary["replicas"], summary["global_batch"]) == (replicas, GLOBAL_BATCH)
    assert summary["steps"] == 2 * 1024 // GLOBAL_BATCH
    assert set(summary["eval"]) == set(summary["train"]) == {"loss", "accuracy", "top3_accuracy"}
    assert summary["eval"]["accuracy"] > 0.3  # 10 classes: chance is 0.1
    assert summary["jit_compile"] is False  # RandomTranslation cannot be compiled by XLA, and says so
    assert "XLA off (auto: layer random_translation (RandomTranslation) cannot be compiled by XLA)" in result.stdout
    assert "top3_accuracy" in result.stdout.split("epoch 1 eval:")[1].splitlines()[0]


EXPORTS = """
import json, sys
import numpy as np, keras, tensorflow as tf, tensorflow_datasets as tfds
run, data_dir = sys.argv[1], sys.argv[2]
test = tfds.builder("synthetic_images", data_dir=data_dir).as_dataset(split="test[:256]", batch_size=-1)
images, labels = test["image"].numpy(), test["label"].numpy()
model = keras.saving.load_model(f"{run}/model.keras")  # safe_mode on
serve = tf.saved_model.load(f"{run}/saved_model").signatures["serving_default"]
spec = serve.structured_input_signature[1]
out = {"input": [model.inputs[0].name, list(model.inputs[0].shape), model.inputs[0].dtype],
       "signature": {name: [list(s.shape), s.dtype.name] for name, s in spec.items()}}
for name, predict in (("keras", lambda x: model(x, training=False).numpy()),
                      ("saved_model", lambda x: serve(image=tf.constant(x))["scores"].numpy())):
    first, second = predict(images), predict(images)
    out[name] = {"repeatable": bool(np.array_equal(first, second)),
                 "accuracy": float(np.mean(np.argmax(first, axis=-1) == labels))}
print(json.dumps(out))
"""


def test_both_exports_take_the_stored_images_and_serve_what_was_evaluated(cnn_one, examples_data_dir):
    _, run, _ = cnn_one
    result = run_python(["-c", EXPORTS, str(run), str(examples_data_dir)])
    assert result.returncode == 0, result.stderr[-3000:]
    exports = json.loads(result.stdout.strip().splitlines()[-1])
    assert exports["input"] == ["image", [None, 32, 32, 3], "uint8"]  # as stored: the scaling is in the model
    assert exports["signature"] == {"image": [[None, 32, 32, 3], "uint8"]}
    accuracy = read_summary(run)["eval"]["accuracy"]
    for name in ("keras", "saved_model"):
        assert exports[name]["repeatable"], name  # augmentation and dropout are off in what is served
        assert exports[name]["accuracy"] == pytest.approx(accuracy, abs=1e-6), name


def test_evaluate_scores_a_forked_run_with_the_settings_it_was_trained_with(cnn_two, tmp_path):
    _, run, _ = cnn_two  # trained on 2 replicas, evaluated on the settings.json's CPU_DEVICES=2 too
    expected = read_summary(run)["eval"]
    for args in (["evaluate"], ["evaluate", "--exported"]):
        # Neither MODEL, DATASET, the splits nor the data dir given: the run's settings.json says them.
        result = run_train(*args, "--output-dir", str(run), cwd=tmp_path, MODEL=None)
        assert result.returncode == 0, result.stderr[-3000:]
        report = json.loads(result.stdout[result.stdout.index("{") :])
        assert report["examples"] == 256
        assert {name: report[name] for name in expected} == pytest.approx(expected, abs=1e-5), args


@pytest.mark.slow
def test_the_cnn_killed_mid_run_resumes_to_the_weights_of_the_uninterrupted_run(cnn_run, tmp_path, examples_data_dir):
    """Augmentation and dropout draw random numbers each step (each replica its own): their state is in the
    checkpoint, so the resumed run draws what the uninterrupted one drew."""
    replicas, reference, _ = cnn_run
    output_dir = tmp_path / "run"
    settings = cnn_settings(examples_data_dir, output_dir, replicas)
    process = start_train("fit", cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **settings)
    kill_mid_run(process, output_dir)

    result = run_train("fit", cwd=tmp_path, **settings)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(output_dir)
    assert summary["resumed_from_step"] > 0
    assert same_weights(output_dir / "model.keras", reference / "model.keras")


def test_a_regression_head_trains_and_reports_its_metrics(tmp_path, examples_data_dir):
    result = run_train(
        "fit", cwd=tmp_path, MODEL="examples.regression", DATASET="synthetic_values", TFDS_DATA_DIR=examples_data_dir,
        OUTPUT_DIR=tmp_path / "run", EPOCHS=4, LEARNING_RATE=0.01, BATCH_SIZE=64,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(tmp_path / "run")
    assert set(summary["eval"]) == {"loss", "mae", "rmse"}
    assert summary["eval"]["mae"] < 1.0  # the values spread about 2.8 around 0
    assert "mae" in result.stdout.split("epoch 1 eval:")[1].splitlines()[0]


def test_a_multi_label_head_reports_a_metric_per_class_as_a_list(tmp_path, examples_data_dir):
    result = run_train(
        "fit", cwd=tmp_path, MODEL="examples.multilabel", DATASET="synthetic_tags", TFDS_DATA_DIR=examples_data_dir,
        OUTPUT_DIR=tmp_path / "run", EPOCHS=3, LEARNING_RATE=0.01, BATCH_SIZE=64, CPU_DEVICES=2,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(tmp_path / "run")
    assert set(summary["eval"]) == {"loss", "binary_accuracy", "f1"}
    assert isinstance(summary["eval"]["f1"], list) and len(summary["eval"]["f1"]) == 5
    assert summary["eval"]["binary_accuracy"] > 0.75
    charted = tensorboard_events(tmp_path / "run" / "logs")["eval"]  # TensorBoard: one scalar per class
    assert [charted[f"f1/{index}"] for index in range(5)] == pytest.approx(summary["eval"]["f1"], abs=1e-6)


# The SavedModel fed what a client has: the eval split's stored images as their JPEG bytes, or its columns by
# name, through serving_default (preprocess(training=False), then the model). Prints its accuracy.
SERVED_ACCURACY = """
import json, sys
import numpy as np
import tensorflow as tf
import tensorflow_datasets as tfds
import train.datasets.synthetic

data_dir, name, split, saved_model = sys.argv[1:5]
loaded = tf.saved_model.load(saved_model)
serve = loaded.signatures["serving_default"]
inputs = serve.structured_input_signature[1]
builder = tfds.builder(name, data_dir=data_dir)
dataset = builder.as_dataset(split=split, shuffle_files=False, decoders={"image": tfds.decode.SkipDecoding()}
                             if "image" in builder.info.features else None)
right = total = 0
for batch in dataset.batch(100):
    columns = batch.get("features", {})
    sent = {key: batch[key] if key in batch else columns[key] for key in inputs}
    predicted = np.argmax(serve(**sent)["scores"].numpy(), axis=-1)
    right, total = right + int(np.sum(predicted == batch["label"].numpy())), total + len(predicted)
print(json.dumps({"inputs": {key: spec.dtype.name for key, spec in inputs.items()}, "accuracy": right / total,
                  "signatures": sorted(loaded.signatures)}))
"""


def served_accuracy(data_dir: Path, name: str, split: str, run: Path) -> dict:
    result = run_python(["-c", SERVED_ACCURACY, str(data_dir), name, split, str(run / "saved_model")])
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_the_resnet_trains_on_photos_of_any_size_and_serves_their_jpeg_bytes(tmp_path, photos_data_dir):
    run = tmp_path / "run"
    # One epoch of 32 steps: measured at 0.68 accuracy (3 epochs, at 0.75, cost half again as much CPU)
    result = run_train(
        "fit", cwd=tmp_path, MODEL=REPO / "examples" / "resnet.py", DATASET="synthetic_photos",
        TFDS_DATA_DIR=photos_data_dir, TRAIN_SPLIT="train[:1024]", EVAL_SPLIT="test", OUTPUT_DIR=run, EPOCHS=1,
        BATCH_SIZE=32, LEARNING_RATE=0.003,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "as the stored records, each preprocessed in tf.data" in result.stdout
    summary = read_summary(run)
    assert summary["eval"]["accuracy"] > 0.3, summary["eval"]  # chance is 1 / the classes
    served = served_accuracy(photos_data_dir, "synthetic_photos", "test", run)
    assert served["inputs"] == {"image": "string"}  # the stored JPEG bytes, by the feature's name
    assert abs(served["accuracy"] - summary["eval"]["accuracy"]) <= 0.005
    assert served["signatures"] == ["serve", "serve_inputs", "serving_default"]  # serve_inputs: preprocess's output


def test_the_tabular_model_takes_each_column_by_name_and_serves_them(tmp_path, photos_data_dir):
    run = tmp_path / "run"
    result = run_train(
        "fit", cwd=tmp_path, MODEL="examples.tabular", DATASET="synthetic_columns", TFDS_DATA_DIR=photos_data_dir,
        OUTPUT_DIR=run, EPOCHS=3, BATCH_SIZE=64, LEARNING_RATE=0.003,
    )  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    summary = read_summary(run)
    assert summary["eval"]["accuracy"] > 0.8, summary["eval"]
    served = served_accuracy(photos_data_dir, "synthetic_columns", "test", run)
    assert set(served["inputs"]) == {"age", "fare", "pclass", "sex", "position"}
    assert abs(served["accuracy"] - summary["eval"]["accuracy"]) <= 0.005
    # model.keras, on the columns by name, with the run's own settings
    exported = run_train("evaluate", "--exported", "--output-dir", str(run), cwd=tmp_path, MODEL=None)
    assert exported.returncode == 0, exported.stderr[-3000:]
    report = json.loads(exported.stdout[exported.stdout.index("{") :])
    assert abs(report["accuracy"] - summary["eval"]["accuracy"]) < 1e-6
