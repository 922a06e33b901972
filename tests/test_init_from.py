"""INIT_FROM and INIT_LAYERS (train/init_from.py, train/presets.py): a new run's weights from a run directory, a
.keras or .weights.h5 file, or a KerasHub preset (a folder, or a name in kagglehub's cache); applied once, before
the step-0 checkpoint; each refusal one line and exit 2, before OUTPUT_DIR is written."""

from __future__ import annotations

import json
import random
import shutil
import zipfile
from pathlib import Path

import pytest

from tests.conftest import needs, read_summary, run_train
from tests.harness.runs import run_two_workers
from train.errors import SettingsError
from train.init_from import init_source
from train.presets import resolve_preset

MODEL = """\
import keras


def build_model(input_shape, num_classes, learning_rate):
    inputs = {name: keras.Input(input_shape[name], name=name) for name in sorted(input_shape)}
    x = keras.layers.Concatenate(name="features")([keras.layers.Reshape((1,))(inputs[name]) for name in sorted(inputs)])
    x = keras.layers.Dense(8, name="backbone_dense")(x)
    x = keras.layers.BatchNormalization(name="backbone_bn")(x)
    outputs = keras.layers.Dense(num_classes, name="head")(x)
    model = keras.Model(inputs, outputs)
    model.compile(keras.optimizers.SGD(learning_rate), keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model
"""
COMMON = {"MODEL": "model.py", "EPOCHS": 1, "BATCH_SIZE": 16, "EVAL_SPLIT": "train", "LABEL_KIND": "class"}
# A tiny KerasHub backbone (random weights): the smallest ResNet KerasHub builds
RESNET = {"input_conv_filters": [64], "input_conv_kernel_sizes": [3], "stackwise_num_filters": [64],
          "stackwise_num_blocks": [1], "stackwise_num_strides": [1], "block_type": "basic_block",
          "use_pre_activation": False, "image_shape": (16, 16, 3)}  # fmt: skip


def _project(folder: Path) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "model.py").write_text(MODEL)
    rows = random.Random(0)
    for name, classes in (("four", 4), ("three", 3)):
        lines = ["a,b,c,d,label"] + [
            ",".join(f"{rows.random():.3f}" for _ in range(4)) + f",{i % classes}" for i in range(64)
        ]
        (folder / f"{name}.csv").write_text("\n".join(lines) + "\n")
    return folder


@pytest.fixture(scope="module")
def run_a(tmp_path_factory) -> Path:
    """Run A: 4 classes, one epoch; its folder (the project) holds runs/a."""
    folder = _project(tmp_path_factory.mktemp("init_from"))
    done = run_train("fit", cwd=folder, DATASET="four.csv", OUTPUT_DIR="runs/a", **COMMON)
    assert done.returncode == 0, done.stderr
    return folder


def _checkpoint_arrays(prefix: Path) -> list:
    import tensorflow as tf

    reader = tf.train.load_checkpoint(str(prefix))
    # the model's trainable weights are saved under the optimizer's names (optimizer/_trainable_variables/N)
    return [reader.get_tensor(key) for key in reader.get_variable_to_shape_map() if "OBJECT_GRAPH" not in key]


def _a_weights(folder: Path, run: str = "runs/a") -> dict:
    import keras

    model = keras.saving.load_model(folder / run / "model.keras", compile=False)
    return {variable.path: variable.numpy() for variable in model.weights}


def _holds(arrays: list, value) -> bool:
    import numpy as np

    return any(array.shape == value.shape and np.array_equal(array, value) for array in arrays)


@pytest.mark.slow
def test_a_run_directory_starts_a_run_on_other_classes_once_on_two_replicas(run_a):
    folder = run_a
    b = run_train("fit", cwd=folder, DATASET="three.csv", OUTPUT_DIR="runs/b", INIT_FROM="runs/a", CPU_DEVICES=2,
                  **COMMON)  # fmt: skip
    assert b.returncode == 0, b.stderr
    assert "INIT_FROM=runs/a: 2 layer(s) loaded, matched by layer name; left out: head (kernel 8x4, here 8x3)." in (
        b.stdout
    )
    record = json.loads((folder / "runs/b/run.json").read_text())["initialized_from"]
    assert record["loaded"] == ["backbone_dense", "backbone_bn"]
    assert record["left_out"] == {"head": "kernel 8x4, here 8x3"}
    assert record["identity"] == read_summary(folder / "runs/a")["weights_sha256"]
    assert read_summary(folder / "runs/b")["initialized_from"] == record
    a, step0 = _a_weights(folder), _checkpoint_arrays(folder / "runs/b/checkpoints/ckpt-0")
    for path in ("backbone_dense/kernel", "backbone_bn/gamma", "backbone_bn/moving_mean", "backbone_bn/moving_variance"
                 ):  # fmt: skip
        assert _holds(step0, a[path]), path  # at step 0, on 2 replicas: A's
    assert any(array.shape == (8, 3) for array in step0)  # the head: as built, with 3 outputs
    # a resume restores it, and never applies it again: the source may be gone
    (folder / "runs/a").rename(folder / "runs/a_away")
    try:
        again = run_train("fit", cwd=folder, DATASET="three.csv", OUTPUT_DIR="runs/b", INIT_FROM="runs/a",
                          CPU_DEVICES=2, **{**COMMON, "EPOCHS": 2})  # fmt: skip
    finally:
        (folder / "runs/a_away").rename(folder / "runs/a")
    assert again.returncode == 0, again.stderr
    assert "layer(s) loaded" not in again.stdout
    assert read_summary(folder / "runs/b")["initialized_from"] == record
    # another INIT_FROM on that run: refused before TensorFlow loads
    other = run_train("fit", cwd=folder, DATASET="three.csv", OUTPUT_DIR="runs/b", INIT_FROM="runs/b/model.keras",
                      **COMMON)  # fmt: skip
    assert other.returncode == 2
    assert "INIT_FROM='runs/b/model.keras', but this run directory started from runs/a" in other.stderr
    assert "Traceback" not in other.stderr


@pytest.mark.slow
def test_a_run_whose_monitor_chose_a_best_epoch_starts_a_run_from_that_epoch(run_a):
    """MONITOR=loss, MONITOR_MODE=max: the best epoch is an early one (loss falls), not the latest checkpoint's."""
    import hashlib

    folder = run_a
    m = run_train("fit", cwd=folder, DATASET="four.csv", OUTPUT_DIR="runs/m", MONITOR="loss", MONITOR_MODE="max",
                  **{**COMMON, "EPOCHS": 3, "LEARNING_RATE": 0.5})  # fmt: skip
    assert m.returncode == 0, m.stderr
    best = read_summary(folder / "runs/m")["best"]["epoch"]
    exported = _a_weights(folder, "runs/m")["backbone_dense/kernel"]
    latest = _checkpoint_arrays(folder / read_summary(folder / "runs/m")["checkpoint"])
    assert best < 3 and not _holds(latest, exported)  # the export is not the latest checkpoint's weights
    b = run_train("fit", cwd=folder, DATASET="three.csv", OUTPUT_DIR="runs/from_m", INIT_FROM="runs/m", **COMMON)
    assert b.returncode == 0, b.stderr
    assert f"INIT_FROM=runs/m: its best epoch {best} (MONITOR=loss), from model.keras: 2 layer(s) loaded" in b.stdout
    assert _holds(_checkpoint_arrays(folder / "runs/from_m/checkpoints/ckpt-0"), exported)
    record = read_summary(folder / "runs/from_m")["initialized_from"]
    assert record["identity"] == hashlib.sha256((folder / "runs/m/model.keras").read_bytes()).hexdigest()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("layers", "message"),
    [
        ("head", "INIT_FROM='runs/a' loads nothing into this model (by layer name, INIT_LAYERS=head)"),
        ("nothing_*", "INIT_LAYERS='nothing_*' matches no layer of this model: its layers are backbone_dense"),
    ],
)
def test_loading_nothing_is_refused_before_the_run_directory_is_written(run_a, layers, message):
    refused = run_train("fit", cwd=run_a, DATASET="three.csv", OUTPUT_DIR=f"runs/{layers[:4]}", INIT_FROM="runs/a",
                        INIT_LAYERS=layers, **COMMON)  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert message in refused.stderr and "Traceback" not in refused.stderr
    assert not (run_a / "runs" / layers[:4]).exists()


@pytest.mark.slow
def test_a_weights_file_and_a_keras_file(run_a):
    import keras

    folder = run_a
    shutil.copy(folder / "runs/a/model.keras", folder / "a.keras")
    a = keras.saving.load_model(folder / "a.keras", compile=False)
    a.save_weights(folder / "a.weights.h5")
    # A's layers in a Sequential of another name: its variables' paths are pretrained/backbone_dense/..., and
    # they match this model's backbone_dense by layer name all the same
    other = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, name="backbone_dense"),
                              keras.layers.BatchNormalization(name="backbone_bn")], name="pretrained")  # fmt: skip
    for name in ("backbone_dense", "backbone_bn"):
        other.get_layer(name).set_weights(a.get_layer(name).get_weights())
    assert other.weights[0].path == "pretrained/backbone_dense/kernel"
    other.save(folder / "other.keras")
    # a run under way: its latest checkpoint, without the export or summary.json it writes at its end
    shutil.copytree(folder / "runs/a/checkpoints", folder / "unfinished/checkpoints")
    for source, matching in (("a.weights.h5", "by Keras's own paths (class and order)"), ("a.keras", "by layer name"),
                             ("other.keras", "by layer name"), ("unfinished", "by layer name")):  # fmt: skip
        out = f"runs/from_{source.replace('.', '_')}"
        done = run_train("fit", cwd=folder, DATASET="three.csv", OUTPUT_DIR=out, INIT_FROM=source,
                         INIT_LAYERS="backbone_*", **COMMON)  # fmt: skip
        assert done.returncode == 0, done.stderr
        assert f"INIT_FROM={source}: 2 layer(s) loaded, matched {matching}" in done.stdout
        record = read_summary(folder / out)["initialized_from"]
        assert record["loaded"] == ["backbone_dense", "backbone_bn"] and record["left_out"] == {}
        step0 = _checkpoint_arrays(folder / out / "checkpoints/ckpt-0")
        assert _holds(step0, _a_weights(folder)["backbone_dense/kernel"])


def test_a_damaged_file_is_refused_in_one_line_before_tensorflow(tmp_path):
    _project(tmp_path)
    (tmp_path / "bad.keras").write_text("not a zip")
    (tmp_path / "bad.weights.h5").write_text("not HDF5")
    for source, said in (("bad.keras", "not a zip archive"), ("bad.weights.h5", "not HDF5"),
                         ("missing.keras", "does not exist")):  # fmt: skip
        refused = run_train("fit", cwd=tmp_path, DATASET="three.csv", OUTPUT_DIR="runs/x", INIT_FROM=source, **COMMON)
        assert refused.returncode == 2 and said in refused.stderr, refused.stderr
        assert refused.stderr.count("\n") == 1 and not (tmp_path / "runs/x").exists()


@pytest.mark.slow
def test_a_keras_file_that_cannot_be_loaded_safely_is_refused_before_the_run_directory_is_written(tmp_path):
    _project(tmp_path)
    with zipfile.ZipFile(tmp_path / "broken.keras", "w") as archive:
        archive.writestr("config.json", "{}")
    refused = run_train("fit", cwd=tmp_path, DATASET="three.csv", OUTPUT_DIR="runs/x", INIT_FROM="broken.keras",
                        **COMMON)  # fmt: skip
    assert refused.returncode == 2, refused.stderr
    assert "INIT_FROM='broken.keras' cannot be loaded safely" in refused.stderr and "Traceback" not in refused.stderr
    assert not (tmp_path / "runs/x").exists()


def _tiny_preset(where: Path) -> Path:
    import keras_hub

    keras_hub.models.ResNetBackbone(**RESNET).save_to_preset(str(where))
    return where


def _with_backbone():
    import keras
    import keras_hub

    inputs = keras.Input(RESNET["image_shape"])
    features = keras.layers.GlobalAveragePooling2D()(keras_hub.models.ResNetBackbone(**RESNET)(inputs))
    return keras.Model(inputs, keras.layers.Dense(3, name="head")(features))


@needs("hub")
def test_a_keras_hub_preset_folder_and_a_preset_name_in_the_kagglehub_cache(tmp_path, monkeypatch):
    import numpy as np

    preset = _tiny_preset(tmp_path / "preset")
    model = _with_backbone()
    source = init_source(str(preset))
    source.check()
    matched = source.match(model, ())
    assert matched.record["loaded"][:2] == ["conv1_conv", "conv1_bn"] and "head" not in matched.record["loaded"]
    matched.apply(lambda line: None)
    import keras_hub

    loaded = keras_hub.models.Backbone.from_preset(str(preset))
    backbone = model.get_layer(index=1)  # the model's nested backbone: its layers by their paths
    kernel = loaded.get_layer("conv1_conv").kernel.numpy()
    assert np.array_equal(backbone.get_layer("conv1_conv").kernel.numpy(), kernel)
    # a name: kagglehub's layout, models/<owner>/<model>/<framework>/<variation>/<version> and its marker
    cache = tmp_path / "kagglehub"
    variation = cache / "models/keras/resnetv1/keras/resnet_18_imagenet"
    shutil.copytree(preset, variation / "3")
    monkeypatch.setenv("KAGGLEHUB_CACHE", str(cache))
    with pytest.raises(SettingsError, match="is not in the kagglehub cache: mount or fill"):
        resolve_preset("resnet_18_imagenet")  # no completion marker: a download cut short
    (variation / "3.complete").touch()
    assert resolve_preset("resnet_18_imagenet") == variation / "3"
    named = init_source("resnet_18_imagenet")
    named.check()
    assert named.match(_with_backbone(), ("conv1_*",)).record["loaded"] == ["conv1_conv", "conv1_bn"]


@needs("hub")
def test_a_preset_name_not_in_the_cache_is_refused_naming_the_folder_to_fill(tmp_path):
    _project(tmp_path)
    cache = tmp_path / "cache"
    refused = run_train("fit", cwd=tmp_path, DATASET="three.csv", OUTPUT_DIR="runs/x", INIT_FROM="resnet_18_imagenet",
                        KAGGLEHUB_CACHE=cache, **COMMON)  # fmt: skip
    assert refused.returncode == 2
    assert f"mount or fill {cache}/models/keras/resnetv1/keras/resnet_18_imagenet" in refused.stderr
    assert refused.stderr.count("\n") == 1 and not (tmp_path / "runs/x").exists()


def _two_workers(folders: list[Path], output_dir: Path, init_from: str) -> tuple[list[int], list[str]]:
    """`fit` on two workers (TF_CONFIG), each in its own folder: their exit codes and what they said."""
    workers = run_two_workers(folders, output_dir.parent, timeout=180, each=[{"TMPDIR": f} for f in folders],
                              **COMMON, DATASET="three.csv", OUTPUT_DIR=output_dir, INIT_FROM=init_from)  # fmt: skip
    return [code for code, _ in workers], [text for _, text in workers]


@pytest.mark.slow
def test_two_workers_each_read_it_and_end_with_the_same_weights(run_a):
    """Every worker reads INIT_FROM (its sha256 joins their agreement) and applies it at step 0: their weights
    agree at the end (finish compares them), and the chief's step-0 checkpoint holds A's backbone."""
    import re

    folder = run_a
    codes, said = _two_workers([folder, folder], folder / "runs/workers", "runs/a")
    assert codes == [0, 0], said
    for text in said:
        assert "INIT_FROM=runs/a: 2 layer(s) loaded, matched by layer name" in text
    hashes = [re.findall(r"Done: \d+ steps; weights sha256 ([0-9a-f]+)", text) for text in said]
    assert hashes[0] and hashes[0] == hashes[1]
    step0 = _checkpoint_arrays(folder / "runs/workers/checkpoints/ckpt-0")
    assert _holds(step0, _a_weights(folder)["backbone_dense/kernel"])


@pytest.mark.slow
def test_workers_whose_init_from_files_differ_stop_before_training(run_a, tmp_path):
    """The same INIT_FROM text naming other bytes on another worker: refused by the workers' agreement."""
    import keras

    other = _project(tmp_path / "other")
    shutil.copy(run_a / "runs/a/model.keras", run_a / "same.keras")
    model = keras.saving.load_model(run_a / "same.keras", compile=False)
    model.get_layer("backbone_dense").kernel.assign(model.get_layer("backbone_dense").kernel + 1.0)
    model.save(other / "same.keras")
    codes, said = _two_workers([run_a, other], tmp_path / "run", "same.keras")
    assert codes == [2, 2], said
    for text in said:
        assert "worker 1 does not match the chief: INIT_FROM sha256" in text, text
    assert not list((tmp_path / "run").glob("checkpoints/*"))
