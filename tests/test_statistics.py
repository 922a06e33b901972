"""BatchNormalization on several replicas: the moving statistics are the replicas' mean wherever they are read
(a checkpoint, an evaluation, the export), and SYNC_BATCH_NORM=true computes the batch moments over every
replica's batch. Each run is a few steps of tests/harness/batch_norm_model.py on 2 logical CPUs."""

from __future__ import annotations

import json
import signal
import time
from pathlib import Path

import pytest

from tests.conftest import REPO, read_summary, run_python, run_train, same_weights, start_train

MODEL = REPO / "tests" / "harness" / "batch_norm_model.py"

INPUT_MEAN = """
import sys, json, numpy as np, keras, tensorflow_datasets as tfds
model = keras.saving.load_model(sys.argv[1])
norm = next(layer for layer in model._flatten_layers() if layer.name == "input_norm")
split = tfds.load("synthetic_clusters", split=sys.argv[3], data_dir=sys.argv[2])
features = np.stack([example["features"] for example in tfds.as_numpy(split)])
print(json.dumps([float(np.max(np.abs(norm.moving_mean.numpy() - features[part].mean(axis=0))))
                  for part in (slice(None), slice(0, len(features) // 2))]))
"""

LARGEST_DIFFERENCE = """
import sys, numpy as np, keras
a, b = (keras.saving.load_model(path) for path in sys.argv[1:3])
assert [w.path for w in a.weights] == [w.path for w in b.weights]
print(max(float(np.max(np.abs(x - y))) for x, y in zip(a.get_weights(), b.get_weights(), strict=True)))
"""

SEAMS = """
import keras
from train.replica_statistics import replica_state, synchronize_batch_norm
numbers, tokens = keras.Input((4,)), keras.Input((5,), dtype="int32")
frozen = keras.layers.Dense(3, name="frozen")
x = keras.layers.Dropout(0.5, seed=1)(frozen(keras.layers.BatchNormalization(name="norm")(numbers)))
frozen.trainable = False
masked = keras.layers.BatchNormalization(name="masked")(keras.layers.Embedding(9, 4, mask_zero=True)(tokens))
model = keras.Model([numbers, tokens], [x, masked])
model.compile("adam", "mse", metrics=["mae"])
print(sorted(variable.path for variable in replica_state(model)))
synchronize_batch_norm(model, print)
"""


def largest_difference(first: Path, second: Path) -> float:
    result = run_python(["-c", LARGEST_DIFFERENCE, str(first), str(second)])
    assert result.returncode == 0, result.stderr[-2000:]
    return float(result.stdout.strip().splitlines()[-1])


def test_the_replica_state_is_the_layers_own_non_trainable_floats_and_a_masked_layer_is_named(tmp_path):
    """Not frozen weights, metric states or seed states; the keras_seams it reads (_non_trainable_variables,
    node.arguments, _keras_mask) are guarded here."""
    result = run_python(["-c", SEAMS], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.strip().splitlines()
    assert json.loads(lines[-2].replace("'", '"')) == [
        "masked/moving_mean", "masked/moving_variance", "norm/moving_mean", "norm/moving_variance",
    ]  # fmt: skip
    assert lines[-1].startswith("warning: SYNC_BATCH_NORM=true: layer 'masked' (BatchNormalization) is called with")
    assert "norm'" not in lines[-1]


def test_two_replicas_export_the_moving_mean_of_the_global_batch(tmp_path, tfds_data_dir):
    """momentum=0: after one step the moving mean is that step's batch mean; 2 equal shards of the whole split."""
    run = tmp_path / "run"
    result = run_train("fit", cwd=tmp_path, MODEL=MODEL, HP_MOMENTUM=0, TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=run,
                       TRAIN_SPLIT="train[:16]", BATCH_SIZE=8, CPU_DEVICES=2, EPOCHS=1)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_summary(run)["replicas"] == 2
    check = run_python(["-c", INPUT_MEAN, str(run / "model.keras"), str(tfds_data_dir), "train[:16]"])
    assert check.returncode == 0, check.stderr[-2000:]
    whole, half = json.loads(check.stdout.strip().splitlines()[-1])
    assert whole < 1e-6 and half > 1e-2  # the global batch's mean, not one replica's half of it


def test_sync_batch_norm_on_two_replicas_trains_as_one_replica_does_and_defines_the_run(tmp_path, tfds_data_dir):
    common = {"MODEL": MODEL, "TFDS_DATA_DIR": tfds_data_dir, "SYNC_BATCH_NORM": "true", "GLOBAL_BATCH_SIZE": 16,
              "BATCH_SIZE": None, "EPOCHS": 1, "STEPS_PER_EPOCH": 4, "TRAIN_SPLIT": "train[:256]"}  # fmt: skip
    for replicas in (1, 2):
        result = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / str(replicas), CPU_DEVICES=replicas, **common)
        assert result.returncode == 0, result.stderr[-3000:]
        assert "SYNC_BATCH_NORM" not in result.stdout + result.stderr  # no layer it cannot synchronise
        assert read_summary(tmp_path / str(replicas))["sync_batch_norm"] is True
        assert json.loads((tmp_path / str(replicas) / "run.json").read_text())["sync_batch_norm"] is True
    assert largest_difference(tmp_path / "1" / "model.keras", tmp_path / "2" / "model.keras") < 1e-5

    again = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "2", CPU_DEVICES=2, **common | {"EPOCHS": 2,
                      "SYNC_BATCH_NORM": "false"})  # fmt: skip
    assert again.returncode == 2
    assert again.stderr.strip().splitlines()[-1] == (
        f"error: SYNC_BATCH_NORM=false, but OUTPUT_DIR={tmp_path / '2'} was trained with SYNC_BATCH_NORM=true: it "
        "defines the run. Set SYNC_BATCH_NORM=true to go on with it, or use another OUTPUT_DIR"
    )


@pytest.mark.slow
def test_sigkill_on_two_replicas_resumes_to_the_uninterrupted_runs_weights_and_statistics(tmp_path, tfds_data_dir):
    """Evaluation runs on both replicas, each with its own copy of the statistics: equal metrics say that each
    replica's copy, not only the saved one, is what the uninterrupted run held."""
    # momentum 0.99 remembers the statistics the restore gave over the 100 steps after it (a checkpoint at each
    # epoch's end only: the kill comes after step 100's)
    settings = {"MODEL": MODEL, "HP_MOMENTUM": 0.99, "TFDS_DATA_DIR": tfds_data_dir, "CPU_DEVICES": 2, "BATCH_SIZE": 16,
                "EPOCHS": 2, "STEPS_PER_EPOCH": 100, "STEPS_PER_CALL": 4, "CHECKPOINT_EVERY": 1000,
                "LOG_EVERY": 1000}  # fmt: skip
    straight = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "straight", **settings)
    assert straight.returncode == 0, straight.stderr[-3000:]
    run = tmp_path / "run"
    process = start_train("fit", cwd=tmp_path, OUTPUT_DIR=run, **settings)
    deadline = time.monotonic() + 120
    while not list(run.glob("checkpoints/ckpt-[1-9]*.index")):
        assert time.monotonic() < deadline and process.poll() is None, "no checkpoint appeared"
        time.sleep(0.05)
    process.send_signal(signal.SIGKILL)
    process.communicate()
    assert not (run / "summary.json").exists()

    resumed = run_train("fit", cwd=tmp_path, OUTPUT_DIR=run, **settings)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary, reference = read_summary(run), read_summary(tmp_path / "straight")
    assert (summary["resumed_from_step"], summary["steps"], reference["steps"]) == (100, 200, 200)
    assert same_weights(run / "model.keras", tmp_path / "straight" / "model.keras")  # the statistics among them
    assert summary["train"] == reference["train"] and summary["eval"] == reference["eval"]
