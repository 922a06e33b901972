"""Start from what exists (issue 45): a run started from another run's weights (INIT_FROM), its backbone frozen
for two epochs (FREEZE, UNFREEZE_AT_EPOCH), then trained; resumed across the phase boundary, it ends where the
run in one go ends. The pieces have their own files: tests/test_init_from.py, tests/test_phases.py,
tests/test_finetune.py (KerasHub presets)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import read_summary, run_python, run_train
from tests.test_local_data import photos

# A backbone (a convolution and its BatchNormalization) and a head, each layer named.
BACKBONE = """
import keras, tensorflow as tf
def preprocess(example, training, seed):
    return tf.image.resize(example["image"], (8, 8)) / 255, example["label"]
def build_model(input_shape, num_classes, learning_rate):
    model = keras.Sequential([
        keras.Input(input_shape),
        keras.layers.Conv2D(4, 3, name="backbone_conv"),
        keras.layers.BatchNormalization(name="backbone_bn"),
        keras.layers.GlobalAveragePooling2D(name="pool"),
        keras.layers.Dense(num_classes, name="head"),
    ])
    model.compile(optimizer=keras.optimizers.Adam(learning_rate),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True), metrics=["accuracy"])
    return model
"""
COMMON = {"MODEL": "backbone.py", "BATCH_SIZE": 8, "LOG_EVERY": 1000, "LEARNING_RATE": 0.01}

LAYERS = """
import json, sys, keras
model = keras.saving.load_model(sys.argv[1])
print(json.dumps({layer.name: [w.tolist() for w in layer.get_weights()] for layer in model.layers}))
"""


def _layers(run: Path) -> dict[str, list]:
    """Each layer's weights (BatchNormalization's moving statistics included) in the run's export, by name."""
    result = run_python(["-c", LAYERS, str(run / "model.keras")])
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_run_from_another_runs_weights_frozen_then_unfrozen_resumes_across_the_boundary(tmp_path):
    (tmp_path / "backbone.py").write_text(BACKBONE)
    photos(tmp_path / "four", classes=("a", "b", "c", "d"))
    photos(tmp_path / "three", classes=("x", "y", "z"), seed=1)
    # run A's Sequential named otherwise: its checkpoint holds pretraining/backbone_conv/..., matched by layer name
    (tmp_path / "pretraining.py").write_text(
        BACKBONE.replace("keras.Sequential([", "keras.Sequential(name='pretraining', layers=[")
    )
    first = run_train("fit", cwd=tmp_path, DATASET="four", OUTPUT_DIR=tmp_path / "a", EPOCHS=2,
                      **{**COMMON, "MODEL": "pretraining.py"})  # fmt: skip
    assert first.returncode == 0, first.stderr[-3000:]
    b = {"DATASET": "three", "INIT_FROM": tmp_path / "a", "FREEZE": "backbone_*", "UNFREEZE_AT_EPOCH": 3, **COMMON}
    frozen = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "b", EPOCHS=2, **b)
    assert frozen.returncode == 0, frozen.stderr[-3000:]
    assert "left out: head (kernel 4x4, here 4x3)" in frozen.stdout + frozen.stderr
    a_layers, b_layers = _layers(tmp_path / "a"), _layers(tmp_path / "b")
    for name in ("backbone_conv", "backbone_bn"):  # kernel, bias; gamma, beta, moving mean and variance
        assert b_layers[name] == a_layers[name], name
    assert len(b_layers["head"][1]) == 3
    recorded = read_summary(tmp_path / "b")["initialized_from"]
    assert recorded["source"] == str(tmp_path / "a") and "head" in str(recorded["left_out"])
    assert {"backbone_conv", "backbone_bn"} <= {path.split("/")[-1] for path in recorded["loaded"]}

    # on to 5 epochs: resumed at the checkpoint of step 2 x steps per epoch, the boundary itself
    resumed = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "b", EPOCHS=5, **b)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    moved = _layers(tmp_path / "b")
    assert moved["backbone_conv"] != a_layers["backbone_conv"] and moved["backbone_bn"] != a_layers["backbone_bn"]
    phases = read_summary(tmp_path / "b")["phases"]
    assert len(phases) == 2 and phases[1]["learning_rate"] == pytest.approx(0.001)  # LEARNING_RATE / 10
    epochs = json.loads((tmp_path / "b" / "epochs.json").read_text())
    assert [entry["phase"] for entry in epochs] == [0, 0, 1, 1, 1]

    straight = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "straight", EPOCHS=5, **b)
    assert straight.returncode == 0, straight.stderr[-3000:]
    assert read_summary(tmp_path / "straight")["weights_sha256"] == read_summary(tmp_path / "b")["weights_sha256"]
