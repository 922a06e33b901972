"""examples/finetune.py: a pretrained backbone fine-tuned on a folder of photos in the keras.io guide's two phases.

The backbones are made here, offline, with random weights: a tiny KerasHub ResNet saved as a preset
(`save_to_preset`, loaded back by KerasHub's own `from_preset`), and keras.applications' MobileNetV2 saved with
`save_weights` (what `weights=` reads). Nothing downloads. The preset tests need the hub extra
(make setup EXTRAS=dev,hub; .ci/run installs it) and skip without it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import REPO, needs, read_summary, run_python, run_train
from tests.test_local_data import photos

MODEL = str(REPO / "examples" / "finetune.py")
needs_hub = needs("hub")
FAST = {"BATCH_SIZE": 8, "LOG_EVERY": 1000, "SEED": 0}

TINY_PRESET = """
import sys, keras, keras_hub
keras.utils.set_random_seed(0)
backbone = keras_hub.models.ResNetBackbone(
    input_conv_filters=[64], input_conv_kernel_sizes=[3], stackwise_num_filters=[64], stackwise_num_blocks=[1],
    stackwise_num_strides=[1], block_type="basic_block", image_shape=(None, None, 3),
)
backbone.save_to_preset(sys.argv[1])
keras_hub.layers.ResNetImageConverter(scale=1 / 255).save_to_preset(sys.argv[1])  # the preset's input scaling
"""

MOBILENET_WEIGHTS = """
import sys, keras
keras.utils.set_random_seed(0)
model = keras.applications.MobileNetV2(input_shape=(160, 160, 3), alpha=0.35, include_top=False, weights=None)
model.save_weights(sys.argv[1])
"""

# The exported model.keras, loaded before KerasHub is imported (it holds Keras layers only), against the backbone
# the run started from (`start`, made by START: a preset's or a weights file's): which of the backbone's weights are
# still the same, which moved.
COMPARE = """
import sys, json, numpy as np, keras
model = keras.saving.load_model(sys.argv[1])
ours = {w.path: w.numpy() for w in model.get_layer("backbone").weights}
START
theirs = {w.path: w.numpy() for w in start.weights}
assert sorted(ours) == sorted(theirs), (sorted(ours)[:5], sorted(theirs)[:5])
print(json.dumps({"same": sorted(p for p in theirs if np.array_equal(ours[p], theirs[p])),
                  "moved": sorted(p for p in theirs if not np.array_equal(ours[p], theirs[p])),
                  "head": model.get_layer("head").kernel.shape[-1]}))
"""
PRESET = "import keras_hub\nstart = keras_hub.models.Backbone.from_preset(sys.argv[2])"
WEIGHTS = """
start = keras.applications.MobileNetV2(input_shape=(160, 160, 3), alpha=0.35, include_top=False, weights=None)
start.load_weights(sys.argv[2])
"""


def made(script: str, where: Path) -> Path:
    result = run_python(["-c", script, str(where)])
    assert result.returncode == 0, result.stderr[-3000:]
    return where


def compare(output_dir: Path, start_code: str, start: Path) -> dict:
    result = run_python(["-c", COMPARE.replace("START", start_code), str(output_dir / "model.keras"), str(start)])
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def epochs_phases(output_dir: Path) -> list[int]:
    return [entry["phase"] for entry in json.loads((output_dir / "epochs.json").read_text())]


@needs_hub
@pytest.mark.slow
def test_a_tiny_preset_is_fine_tuned_in_two_phases_its_batch_normalization_in_inference_mode(tmp_path):
    """Phase 0 (HP_HEAD_EPOCHS=1): the backbone is the preset's to the bit, only the head learns. The same run
    resumed with EPOCHS=3 enters phase 1: the backbone's kernels move at HP_FINE_TUNE_LEARNING_RATE, its
    BatchNormalization does not (inference mode, as the guide wants: its statistics stay the preset's)."""
    preset = made(TINY_PRESET, tmp_path / "tiny_resnet")
    folder = photos(tmp_path / "photos")
    run = {"MODEL": MODEL, "DATASET": str(folder), "TFDS_DATA_DIR": tmp_path / "tfds", "HP_PRESET": preset}
    run |= {"OUTPUT_DIR": tmp_path / "run", "HP_HEAD_EPOCHS": 1, "HP_FINE_TUNE_LEARNING_RATE": 1e-3, **FAST}
    first = run_train("fit", cwd=tmp_path, EPOCHS=1, **run)
    assert first.returncode == 0, first.stderr[-3000:]
    frozen = compare(tmp_path / "run", PRESET, preset)
    assert frozen["moved"] == [] and len(frozen["same"]) > 10 and frozen["head"] == 3
    assert epochs_phases(tmp_path / "run") == [0]

    second = run_train("fit", cwd=tmp_path, EPOCHS=3, **run)
    assert second.returncode == 0, second.stderr[-3000:]
    tuned = compare(tmp_path / "run", PRESET, preset)
    assert {"conv1_conv/kernel", "stack0_block0_1_conv/kernel", "stack0_block0_2_conv/kernel"} <= set(tuned["moved"])
    normalization = [path for path in tuned["same"] + tuned["moved"] if "_bn/" in path]
    assert len(normalization) == 12 and set(normalization) <= set(tuned["same"])  # statistics, scale and offset
    assert epochs_phases(tmp_path / "run") == [0, 1, 1]
    head, everything = read_summary(tmp_path / "run")["phases"]
    assert head["trainable"] == ["head"] and "conv1_conv" in everything["trainable"]
    assert everything["learning_rate"] == pytest.approx(1e-3)


@pytest.mark.slow
def test_keras_applications_weights_from_a_local_file_are_the_frozen_backbone(tmp_path):
    """HP_WEIGHTS: MobileNetV2's weights= a local file (KerasHub not needed); after the head's phase the backbone
    holds exactly that file's weights."""
    weights = made(MOBILENET_WEIGHTS, tmp_path / "mobilenet_v2.weights.h5")
    folder = photos(tmp_path / "photos")
    result = run_train(
        "fit", cwd=tmp_path, MODEL=MODEL, DATASET=str(folder), TFDS_DATA_DIR=tmp_path / "tfds",
        OUTPUT_DIR=tmp_path / "run", HP_WEIGHTS=weights, EPOCHS=1, **FAST,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    frozen = compare(tmp_path / "run", WEIGHTS, weights)
    assert frozen["moved"] == [] and len(frozen["same"]) > 100 and frozen["head"] == 3


def test_neither_or_both_backbones_is_one_line_and_exit_2(tmp_path):
    folder = photos(tmp_path / "photos")
    base = {"MODEL": MODEL, "DATASET": str(folder), "TFDS_DATA_DIR": tmp_path / "tfds", **FAST}
    for hp in ({}, {"HP_PRESET": tmp_path / "p", "HP_WEIGHTS": tmp_path / "w.h5"}):
        result = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / f"run{len(hp)}", **base, **hp)
        assert result.returncode == 2, result.stderr[-3000:]
        assert "HP_PRESET=" in result.stderr and "Traceback" not in result.stderr
        assert not (tmp_path / f"run{len(hp)}" / "checkpoints").exists()


@needs_hub
@pytest.mark.slow
def test_a_preset_name_is_found_in_the_kagglehub_cache_and_a_missing_one_is_exit_2_naming_it(tmp_path):
    """HP_PRESET as a name: the preset in KAGGLEHUB_CACHE, where kagglehub.model_download puts it
    (models/<owner>/<model>/<framework>/<variation>/<version>, and <version>.complete once whole); a name not there
    is one line naming the directory to fill, exit 2, and nothing downloads."""
    cache = tmp_path / "kagglehub"
    preset = made(TINY_PRESET, cache / "models" / "keras" / "tiny_resnet" / "keras" / "tiny_resnet" / "1")
    (preset.parent / "1.complete").touch()  # kagglehub's marker of a finished download (kagglehub/cache.py)
    folder = photos(tmp_path / "photos")
    run = {"MODEL": MODEL, "DATASET": str(folder), "TFDS_DATA_DIR": tmp_path / "tfds", "KAGGLEHUB_CACHE": cache}
    found = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "found", EPOCHS=1, HP_HEAD_EPOCHS=1, **run, **FAST,
                      HP_PRESET="kaggle://keras/tiny_resnet/keras/tiny_resnet/1")  # fmt: skip
    assert found.returncode == 0, found.stderr[-3000:]
    assert compare(tmp_path / "found", PRESET, preset)["moved"] == []
    missing = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "missing", **run, **FAST,
                        HP_PRESET="kaggle://keras/tiny_resnet/keras/other/1")  # fmt: skip
    assert missing.returncode == 2 and str(cache) in missing.stderr and "Traceback" not in missing.stderr
    assert not (tmp_path / "missing" / "checkpoints").exists()
