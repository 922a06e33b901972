"""`python -m train formats` and EXPORT_FORMATS (issue 57): model.keras as ONNX and LiteRT, each run in its own
runtime (onnxruntime, the LiteRT interpreter) and compared with the Keras model before it is kept; int8 with its
accuracy beside the float model's; what a format cannot carry refused in one line. Every run here is a real
`python -m train` process on CPU; the tests read the artifacts back with the runtimes themselves."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import needs, read_summary, run_python, run_train

SMALL = {"TRAIN_SPLIT": "train[:1024]", "EVAL_SPLIT": "test[:512]", "EPOCHS": 1, "BATCH_SIZE": 64}

# What a user runs after `formats`: model.keras and the two artifacts on the same inputs, in their own runtimes.
READ_BACK = """
import json, sys
import keras, numpy as np, onnxruntime
from ai_edge_litert.interpreter import Interpreter
run = sys.argv[1]
model = keras.saving.load_model(run + "/model.keras")
x = np.random.default_rng(0).standard_normal((7, 32)).astype("float32")
expected = np.asarray(model(x))
onnx = onnxruntime.InferenceSession(run + "/formats/model.onnx").run(["scores"], {"features": x})[0]
litert = Interpreter(model_path=run + "/formats/model.tflite").get_signature_runner()(features=x)["scores"]
print(json.dumps({"onnx": float(np.abs(onnx - expected).max()), "litert": float(np.abs(litert - expected).max())}))
"""


def convert(*args: str, cwd: Path, **settings: object):
    """`python -m train formats ARGS` as a user types it after `fit`: the run's settings.json gives MODEL."""
    return run_train("formats", *args, cwd=cwd, MODEL=None, **settings)


def _ok(result) -> None:
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr and "This is a bug" not in result.stderr, result.stderr[-3000:]


def _refused(result, *said: str) -> str:
    """The one `error:` line of a refusal, exit 2, each of `said` in it."""
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-3000:]
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "Traceback" not in result.stderr, result.stderr[-3000:]
    for each in said:
        assert each in errors[0], errors[0]
    return errors[0]


@pytest.fixture(scope="module")
def default_run(tmp_path_factory, tfds_data_dir) -> Path:
    """The documented MLP on the default dataset, trained to its export."""
    run = tmp_path_factory.mktemp("formats") / "run"
    _ok(run_train("fit", cwd=run.parent, TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=run, **SMALL))
    return run


@needs("formats")
def test_the_default_model_converts_to_both_formats_each_checked_and_quantized(default_run, tfds_data_dir):
    result = convert(
        "--format", "onnx,litert", "--quantize", "int8",
        "--output-dir", str(default_run), cwd=default_run.parent, TFDS_DATA_DIR=tfds_data_dir,
    )  # fmt: skip
    _ok(result)
    record = json.loads((default_run / "formats" / "formats.json").read_text())
    assert sorted(path.name for path in (default_run / "formats").iterdir()) == [
        "formats.json", "model.int8.onnx", "model.int8.tflite", "model.onnx", "model.tflite",
    ]  # fmt: skip
    assert not (default_run / "formats.tmp").exists()
    assert record["classes"] == [str(index) for index in range(10)] and record["mixed_precision_gap"] is None
    assert record["inputs_from"].startswith("the eval split")
    for name in ("onnx", "litert"):
        entry = record["artifacts"][name]
        assert entry["bytes"] == (default_run / "formats" / entry["file"]).stat().st_size
        assert entry["inputs"] == [{"name": "features", "shape": [None, 32], "dtype": "float32"}]
        assert entry["outputs"] == [{"name": "scores", "shape": [None, 10], "dtype": "float32"}]
        assert entry["parity"]["examples"] == 256 and entry["parity"]["batch_sizes"] == [1, 256]
        assert entry["parity"]["max_abs_difference"] <= 1e-4
        quantized = record["artifacts"][f"{name}.int8"]
        assert quantized["bytes"] < quantized["float_bytes"] == entry["bytes"]
        accuracy = quantized["accuracy"]
        assert accuracy["measure"] == "accuracy" and accuracy["examples"] == 512
        assert accuracy["float"] == pytest.approx(read_summary(default_run)["eval"]["accuracy"], abs=1e-6)
        assert abs(accuracy["int8"] - accuracy["float"]) < 0.05
        assert f"{name}: formats/{entry['file']}" in result.stdout and f"{name} int8: " in result.stdout
    read_back = run_python(["-c", READ_BACK, str(default_run)])
    _ok(read_back)
    assert max(json.loads(read_back.stdout.splitlines()[-1]).values()) <= 1e-5


@needs("formats")
def test_an_artifact_over_the_tolerance_is_not_kept_and_exits_1(default_run, tfds_data_dir, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    for name in ("model.keras", "run.json", "settings.json", "summary.json"):
        (run / name).write_bytes((default_run / name).read_bytes())
    result = convert("--format", "onnx", "--atol", "0", "--output-dir", str(run), cwd=tmp_path,
                       TFDS_DATA_DIR=tfds_data_dir)  # fmt: skip
    assert result.returncode == 1, result.stderr[-3000:]
    assert "error: onnx's 'scores' differs from model.keras by " in result.stderr
    assert "nothing of it is kept" in result.stderr and "Traceback" not in result.stderr
    assert not (run / "formats").exists() and not (run / "formats.tmp").exists()


def test_what_cannot_be_converted_is_refused_before_tensorflow_loads(default_run, tmp_path, monkeypatch):
    unknown = convert("--format", "onnx,coreml", "--output-dir", str(default_run), cwd=tmp_path)
    _refused(unknown, "--format='onnx,coreml' is not allowed: 'coreml' is not a format", "onnx, litert")
    empty = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "run", EXPORT_FORMATS="onnx,tf")
    _refused(empty, "EXPORT_FORMATS='onnx,tf' is not allowed: 'tf' is not a format")
    assert not (tmp_path / "run").exists()
    untrained = convert("--output-dir", str(tmp_path), cwd=tmp_path)
    if (missing := needs("formats")).args[0]:  # without the extra, that is what is said first
        _refused(untrained, "make setup EXTRAS=dev,formats")
        return
    _refused(untrained, f"OUTPUT_DIR={tmp_path} has no model.keras to convert: run fit to its end first")
    assert not missing.args[0]
    wrong = convert("--quantize", "int4", "--output-dir", str(default_run), cwd=tmp_path)
    assert wrong.returncode == 2 and "Invalid value for '--quantize': " in wrong.stderr  # click's, as for any flag
    assert "'int4' is not one of 'int8'" in wrong.stderr and "Traceback" not in wrong.stderr


def test_without_the_extra_formats_names_it(default_run, monkeypatch):
    """Fakes a missing module: train.formats.MODULES, the list the real check looks up, names one not installed."""
    from typer.testing import CliRunner

    import train.formats
    from train.cli import app

    monkeypatch.setattr(train.formats, "MODULES", (*train.formats.MODULES, "a_module_not_installed"))
    result = CliRunner().invoke(app, ["formats", "--output-dir", str(default_run)])
    assert result.exit_code == 2
    assert "a_module_not_installed (the formats extra): make setup EXTRAS=dev,formats" in result.output


@needs("formats")
def test_export_formats_makes_fit_write_them_after_its_export(tmp_path, tfds_data_dir):
    run = tmp_path / "run"
    result = run_train("fit", cwd=tmp_path, TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=run, EXPORT_FORMATS="litert",
                       **SMALL)  # fmt: skip
    _ok(result)
    record = json.loads((run / "formats" / "formats.json").read_text())
    assert list(record["artifacts"]) == ["litert"] and (run / "formats" / "model.tflite").is_file()
    assert "litert: formats/model.tflite " in result.stdout
    assert result.stdout.index("model exported to") < result.stdout.index("litert: formats/model.tflite")
    # a second conversion replaces formats/ whole: formats.json lists what the folder holds
    again = convert("--format", "onnx", "--output-dir", str(run), cwd=tmp_path, TFDS_DATA_DIR=tfds_data_dir)
    _ok(again)
    assert list(json.loads((run / "formats" / "formats.json").read_text())["artifacts"]) == ["onnx"]
    assert sorted(path.name for path in (run / "formats").iterdir()) == ["formats.json", "model.onnx"]


# The examples/ models, each trained briefly on its offline dataset (the data dir fixture that holds it): each
# converts with parity (item 5). What each measures its int8 model by, where it has labels.
EXAMPLES = {
    "cnn": ("examples_data_dir", {"DATASET": "synthetic_images", "EVAL_SPLIT": "test[:256]"}, "accuracy"),
    "regression": ("examples_data_dir", {"DATASET": "synthetic_values"}, "mae"),
    "multilabel": ("examples_data_dir", {"DATASET": "synthetic_tags"}, "binary_accuracy"),
    "gan": ("examples_data_dir", {"DATASET": "synthetic_images"}, "max_abs_difference"),  # export_model: noise in
    "tabular": ("photos_data_dir", {"DATASET": "synthetic_columns"}, "accuracy"),
    "tabular_text": ("photos_data_dir", {"DATASET": "synthetic_columns"}, "accuracy"),
    "resnet": ("photos_data_dir", {"DATASET": "synthetic_photos", "EVAL_SPLIT": "test[:64]"}, "accuracy"),
    "text": ("text_data_dir", {"DATASET": "synthetic_reviews"}, "accuracy"),
    "custom_step": ("tfds_data_dir", {}, "accuracy"),
    "early_stopping": ("tfds_data_dir", {"MONITOR": "val_accuracy"}, "accuracy"),
}


@pytest.mark.slow
@needs("formats")
@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_each_example_converts_to_both_formats_with_parity(example, tmp_path, request):
    fixture, settings, measure = EXAMPLES[example]
    data_dir, run = request.getfixturevalue(fixture), tmp_path / "run"
    brief = {"TRAIN_SPLIT": "train[:256]", "EPOCHS": 1, "BATCH_SIZE": 32, "JIT_COMPILE": None}
    _ok(run_train("fit", cwd=tmp_path, MODEL=f"examples.{example}", TFDS_DATA_DIR=data_dir, OUTPUT_DIR=run,
                  **{**brief, **settings}))  # fmt: skip
    result = convert("--quantize", "int8", "--output-dir", str(run), cwd=tmp_path, TFDS_DATA_DIR=data_dir)
    _ok(result)
    record = json.loads((run / "formats" / "formats.json").read_text())
    assert sorted(record["artifacts"]) == ["litert", "litert.int8", "onnx", "onnx.int8"]
    for name in ("onnx", "litert"):
        assert record["artifacts"][name]["parity"]["max_abs_difference"] <= 1e-4
        assert record["artifacts"][f"{name}.int8"]["accuracy"]["measure"] == measure
    random = example == "gan"  # export_model's generator takes noise: seeded random inputs, said so
    assert record["inputs_from"].startswith("256 seeded random inputs" if random else "the eval split")


@pytest.mark.slow
@needs("formats")
def test_the_fine_tuned_backbone_converts_with_parity(tmp_path):
    """examples/finetune.py on MobileNetV2 (keras.applications, its weights from a local file: no KerasHub)."""
    from tests.test_finetune import MOBILENET_WEIGHTS, made
    from tests.test_local_data import photos

    weights, run = made(MOBILENET_WEIGHTS, tmp_path / "mobilenet_v2.weights.h5"), tmp_path / "run"
    folder = photos(tmp_path / "photos")
    _ok(run_train("fit", cwd=tmp_path, MODEL="examples.finetune", DATASET=str(folder), TFDS_DATA_DIR=tmp_path / "tfds",
                  OUTPUT_DIR=run, HP_WEIGHTS=weights, EPOCHS=1, BATCH_SIZE=8))  # fmt: skip
    _ok(convert("--output-dir", str(run), cwd=tmp_path, TFDS_DATA_DIR=tmp_path / "tfds"))
    artifacts = json.loads((run / "formats" / "formats.json").read_text())["artifacts"]
    assert [artifacts[name]["parity"]["max_abs_difference"] <= 1e-4 for name in ("onnx", "litert")] == [True, True]


@pytest.mark.slow
@needs("formats")
def test_the_keras_io_dcgan_exports_its_generator_to_both_formats(tmp_path):
    """examples/dcgan.py on a folder without labels: export_model's generator takes latent vectors, so the inputs
    are seeded random ones, and there is no label to score the int8 model by."""
    from tests.test_dcgan import SMALL as DCGAN
    from tests.test_dcgan import faces

    run = tmp_path / "run"
    _ok(run_train("fit", cwd=tmp_path, **{**DCGAN, "DATASET": faces(tmp_path / "faces"), "OUTPUT_DIR": run},
                  TFDS_DATA_DIR=tmp_path / "tfds"))  # fmt: skip
    _ok(convert("--quantize", "int8", "--output-dir", str(run), cwd=tmp_path, TFDS_DATA_DIR=tmp_path / "tfds"))
    record = json.loads((run / "formats" / "formats.json").read_text())
    assert record["inputs_from"].startswith("256 seeded random inputs") and record["classes"] == []
    for name in ("onnx", "litert"):
        entry = record["artifacts"][name]
        assert [(each["shape"], each["dtype"]) for each in entry["inputs"]] == [([None, 8], "float32")]  # latent
        assert entry["parity"]["max_abs_difference"] <= 1e-4
        assert record["artifacts"][f"{name}.int8"]["accuracy"]["measure"] == "max_abs_difference"


@pytest.mark.slow
@needs("formats")
def test_a_run_on_two_replicas_in_mixed_precision_is_converted_in_float32(tmp_path, tfds_data_dir):
    run = tmp_path / "run"
    _ok(run_train("fit", cwd=tmp_path, TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=run, CPU_DEVICES=2,
                  MIXED_PRECISION="mixed_bfloat16", JIT_COMPILE=None, **SMALL))  # fmt: skip
    result = convert("--output-dir", str(run), cwd=tmp_path, TFDS_DATA_DIR=tfds_data_dir)
    _ok(result)
    record = json.loads((run / "formats" / "formats.json").read_text())
    gap = record["mixed_precision_gap"]
    assert gap["output"] == "scores" and 0 < gap["max_abs_difference"] < 0.05  # bfloat16 has 8 bits of mantissa
    assert "model.keras computes in mixed precision: converted in float32" in result.stdout
    for name in ("onnx", "litert"):  # against the float32 rebuild, at float32's tolerance
        assert record["artifacts"][name]["parity"]["max_abs_difference"] <= 1e-4


@needs("formats")
def test_a_model_with_a_lookup_inside_is_refused_naming_the_layer_and_the_format(tmp_path, tfds_data_dir):
    (tmp_path / "lookup.py").write_text(LOOKUP)
    run = tmp_path / "run"
    refused = run_train("fit", cwd=tmp_path, MODEL="lookup.py", TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=run,
                        EXPORT_FORMATS="onnx", **SMALL)  # fmt: skip
    _refused(refused, "onnx cannot carry the layer 'buckets' (Hashing), a lookup inside the model")
    assert not (run / "checkpoints").exists()  # before the first step
    _ok(run_train("fit", cwd=tmp_path, MODEL="lookup.py", TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=run, **SMALL))
    later = convert("--format", "litert", "--output-dir", str(run), cwd=tmp_path, TFDS_DATA_DIR=tfds_data_dir)
    _refused(later, "litert cannot carry the layer 'buckets' (Hashing)")
    assert not (run / "formats").exists() and not (run / "formats.tmp").exists()


def test_a_conversion_failing_after_training_leaves_the_run_exported_and_exits_1(tmp_path, tfds_data_dir):
    """A layer of TensorFlow's that no converter takes: only trying finds that out, after the training."""
    (tmp_path / "dawson.py").write_text(DAWSON)
    run = tmp_path / "run"
    result = run_train("fit", cwd=tmp_path, MODEL="dawson.py", TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=run,
                       EXPORT_FORMATS="onnx,litert", **SMALL)  # fmt: skip
    if needs("formats").args[0]:
        _refused(result, "make setup EXTRAS=dev,formats")
        return
    assert result.returncode == 1, result.stdout[-2000:] + result.stderr[-3000:]
    (error,) = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert error.startswith("error: the run is trained and exported, but EXPORT_FORMATS=onnx,litert failed: ")
    assert error.endswith(f"once that is fixed, run python -m train formats --output-dir {run} --format onnx,litert")
    assert "Traceback" not in result.stderr and read_summary(run)["exported_model"]
    assert (run / "model.keras").is_file() and (run / "saved_model").is_dir()
    assert not (run / "formats").exists() and not (run / "formats.tmp").exists()


@needs("formats")
def test_quantizing_a_model_without_a_weight_matrix_is_refused(tmp_path, tfds_data_dir):
    (tmp_path / "no_matrix.py").write_text(NO_MATRIX)
    run = tmp_path / "run"
    _ok(run_train("fit", cwd=tmp_path, MODEL="no_matrix.py", TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=run, **SMALL))
    refused = convert("--quantize", "int8", "--output-dir", str(run), cwd=tmp_path, TFDS_DATA_DIR=tfds_data_dir)
    _refused(refused, "--quantize int8 has nothing to quantize (no layer with a weight matrix")
    assert not (run / "formats").exists()


# Dawson's integral, an op of TensorFlow's that neither tf2onnx nor LiteRT's builtins take.
DAWSON = """
import keras
import tensorflow as tf


@keras.saving.register_keras_serializable(package="dawson")
class Dawson(keras.layers.Layer):
    def call(self, inputs):
        return tf.math.special.dawsn(inputs)


def build_model(input_shape, num_classes, learning_rate):
    inputs = keras.Input(input_shape, name="features")
    hidden = keras.layers.Dense(16)(Dawson()(inputs))
    model = keras.Model(inputs, keras.layers.Dense(num_classes, activation="softmax")(hidden))
    model.compile(keras.optimizers.Adam(learning_rate), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model
"""

# No weight matrix: a slice of the features, normalised (BatchNormalization's weights have one axis), a softmax.
NO_MATRIX = """
import keras


def build_model(input_shape, num_classes, learning_rate):
    inputs = keras.Input(input_shape, name="features")
    scaled = keras.layers.BatchNormalization()(inputs[:, :num_classes])
    model = keras.Model(inputs, keras.layers.Activation("softmax")(scaled))
    model.compile(keras.optimizers.Adam(learning_rate), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model
"""

# A model of the default dataset with a lookup inside it: its features bucketed by a Hashing layer.
LOOKUP = """
import keras


def build_model(input_shape, num_classes, learning_rate):
    inputs = keras.Input(input_shape, name="features")
    buckets = keras.layers.Hashing(num_bins=8, name="buckets")(keras.ops.cast(inputs * 10, "int32"))
    hidden = keras.layers.Dense(16, activation="relu")(keras.ops.cast(buckets, "float32"))
    model = keras.Model(inputs, keras.layers.Dense(num_classes, activation="softmax")(hidden))
    model.compile(keras.optimizers.Adam(learning_rate), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model
"""
