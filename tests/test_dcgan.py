"""Data without labels and the keras.io DCGAN (issue 41, item 8): LABEL_KEY=none gives the model its inputs
alone, as Keras's image_dataset_from_directory(label_mode=None) does, on every kind of DATASET; the DCGAN as
keras.io publishes it (examples/dcgan.py: its class unchanged, its sizes from the data, plus export_model) then
trains, resumes and exports its generator, on 1 device and on 2 replicas. Each run is a process of its own."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.conftest import REPO, prepare_data_dir, read_summary, run_python, run_train

DCGAN = str(REPO / "examples" / "dcgan.py")
# What a user would change for a small run: the latent size, the batch, the epochs. The images are 8x8.
SMALL = {"MODEL": DCGAN, "LABEL_KEY": "none", "HP_LATENT_DIM": 8, "BATCH_SIZE": 8, "EPOCHS": 1, "LOG_EVERY": 1000}

# A call() a user adds to the published GAN (the served model: its discriminator's score)
CALL = "    def call(self, images):\n        return self.discriminator(images)\n\n"

EXPORTED = """
import json, sys, keras
model = keras.saving.load_model(sys.argv[1])
print(json.dumps([model.name, list(model.inputs[0].shape), list(model.outputs[0].shape)]))
"""


@pytest.fixture(scope="module")
def sketches_data_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """synthetic_sketches (tests/datasets): 8x8x1 images, no label feature at all."""
    data_dir = tmp_path_factory.mktemp("sketches")
    script = (
        "import sys, tensorflow_datasets as tfds, tests.datasets\n"
        "tfds.builder('synthetic_sketches', data_dir=sys.argv[1]).download_and_prepare()"
    )
    prepare_data_dir(script, data_dir)
    return data_dir


def faces(root: Path, count: int = 40) -> Path:
    """One folder of same-size 8x8 photos, PNG and JPEG (as keras.io's CelebA DCGAN reads img_align_celeba/)."""
    rng = np.random.default_rng(0)
    folder = root / "img_align_celeba"
    folder.mkdir(parents=True)
    for index in range(count):
        pixels = rng.integers(0, 255, (8, 8, 3), dtype=np.uint8)
        Image.fromarray(pixels).save(folder / (f"{index}.png" if index % 2 else f"{index}.jpg"))
    return root


def exported(run: Path) -> list:
    result = run_python(["-c", EXPORTED, str(run / "model.keras")])
    assert result.returncode == 0, result.stderr[-2000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def trained(result, run: Path) -> dict:
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert "d_loss" in result.stdout and "g_loss" in result.stdout
    return read_summary(run)


def error_line(result) -> str:
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    return result.stderr.strip().splitlines()[-1]


@pytest.mark.slow
def test_the_keras_io_dcgan_trains_on_a_folder_without_labels_resumes_and_exports_its_generator(tmp_path):
    folder, run = faces(tmp_path / "faces"), tmp_path / "run"
    settings = {**SMALL, "DATASET": folder, "TFDS_DATA_DIR": tmp_path / "tfds", "OUTPUT_DIR": run}
    first = trained(run_train("fit", cwd=tmp_path, **settings), run)
    assert first["eval"] == {}  # no test_step: nothing to score
    again = trained(run_train("fit", cwd=tmp_path, **{**settings, "EPOCHS": 2}), run)
    assert again["resumed_from_step"] == first["steps"] and again["steps"] == 2 * first["steps"]
    assert exported(run) == ["generator", [None, 8], [None, 8, 8, 3]]  # export_model's: latent vectors in

    evaluated = run_train(
        "evaluate", "--output-dir", str(run), cwd=tmp_path, MODEL=None, TFDS_DATA_DIR=tmp_path / "tfds"
    )
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert "Traceback" not in evaluated.stderr


@pytest.mark.slow
def test_the_dcgan_trains_on_a_tfds_dataset_without_a_label_on_two_replicas_and_resumes(tmp_path, sketches_data_dir):
    run = tmp_path / "run"
    settings = {**SMALL, "DATASET": "synthetic_sketches", "TFDS_DATA_DIR": sketches_data_dir, "OUTPUT_DIR": run,
                "CPU_DEVICES": 2}  # fmt: skip
    first = trained(run_train("fit", cwd=tmp_path, **settings), run)
    assert first["replicas"] == 2 and first["global_batch"] == 16
    again = trained(run_train("fit", cwd=tmp_path, **{**settings, "EPOCHS": 2}), run)
    assert again["resumed_from_step"] == first["steps"] and again["steps"] == 2 * first["steps"]
    assert exported(run) == ["generator", [None, 8], [None, 8, 8, 1]]  # the images' one channel


def test_each_edit_the_published_dcgan_needed_is_one_whole_line_naming_the_fix(tmp_path, sketches_data_dir):
    """Without LABEL_KEY=none: the step is given (images, labels), or a dataset has no label; without export_model:
    there is nothing to export. Each before anything is written."""
    folder = faces(tmp_path / "faces")  # keras.io's one folder: one class, refused as such, naming LABEL_KEY=none
    one = error_line(run_train("fit", cwd=tmp_path, **{**SMALL, "LABEL_KEY": None}, DATASET=folder,
                               TFDS_DATA_DIR=tmp_path / "tfds", OUTPUT_DIR=tmp_path / "one"))  # fmt: skip
    assert "holds one class folder" in one and one.endswith("set LABEL_KEY=none to train on the images without labels")
    shutil.copytree(folder / "img_align_celeba", folder / "more_faces")  # two classes: labels reach the step
    labeled = error_line(run_train("fit", cwd=tmp_path, **{**SMALL, "LABEL_KEY": None}, DATASET=folder,
                                   TFDS_DATA_DIR=tmp_path / "tfds", OUTPUT_DIR=tmp_path / "labeled"))  # fmt: skip
    assert "its train_step failed on a batch" in labeled and labeled.endswith("set LABEL_KEY=none"), labeled
    assert "compiled loss" not in labeled
    no_label = error_line(run_train("fit", cwd=tmp_path, **{**SMALL, "LABEL_KEY": None}, DATASET="synthetic_sketches",
                                    TFDS_DATA_DIR=sketches_data_dir, OUTPUT_DIR=tmp_path / "no_label"))  # fmt: skip
    assert no_label.endswith("use one of image, or LABEL_KEY=none for data without labels"), no_label

    unexported = tmp_path / "unexported.py"
    source = Path(DCGAN).read_text()
    unexported.write_text(source[: source.index("def export_model")])
    line = error_line(run_train("fit", cwd=tmp_path, **{**SMALL, "MODEL": str(unexported)},
                                DATASET="synthetic_sketches", TFDS_DATA_DIR=sketches_data_dir,
                                OUTPUT_DIR=tmp_path / "unexported"))  # fmt: skip
    assert "GAN trains with its own train_step and defines no call(), so there is no model to export" in line
    assert "define export_model(model)" in line and line.endswith("or define call(inputs)"), line

    called = tmp_path / "called.py"  # the edit a user made before: a call() (then the GAN's own save fails)
    called.write_text(unexported.read_text().replace("    def train_step(", CALL + "    def train_step(", 1))
    line = error_line(run_train("fit", cwd=tmp_path, **{**SMALL, "MODEL": str(called)},
                                DATASET="synthetic_sketches", TFDS_DATA_DIR=sketches_data_dir,
                                OUTPUT_DIR=tmp_path / "called"))  # fmt: skip
    assert "(NotImplementedError: Object GAN was created by passing non-serializable argument values in " in line
    assert "Please implement `get_config()`.): define export_model(model) in the MODEL file" in line, line
    names = ("labeled", "no_label", "unexported", "called")
    assert not any((tmp_path / name).exists() for name in names)


LABELED_PREPROCESS = """
import tensorflow as tf
from examples.dcgan import build_model, export_model


def preprocess(example, training, seed):
    return tf.image.resize(example["image"], (8, 8)) / 255, example["label"]
"""


def test_a_preprocess_that_returns_a_label_under_label_key_none_is_one_line(tmp_path):
    (tmp_path / "labeled.py").write_text(LABELED_PREPROCESS)
    line = error_line(run_train("fit", cwd=tmp_path, **{**SMALL, "MODEL": "labeled.py", "HP_LATENT_DIM": None},
                                DATASET=faces(tmp_path / "f"),
                                TFDS_DATA_DIR=tmp_path / "tfds", OUTPUT_DIR=tmp_path / "run"))  # fmt: skip
    assert line == (
        "error: MODEL='labeled.py': preprocess(training=True) returns a tuple of 2, but LABEL_KEY=none gives the "
        "model its inputs alone: return them alone (a tensor, or a dict of tensors keyed by the model's keras.Input "
        "names)"
    )
    assert not (tmp_path / "run").exists()


COLUMNS = '''
import keras, tensorflow as tf


@keras.saving.register_keras_serializable(package="columns")
class Reconstructs(keras.Model):
    """Learns to give back its columns: no label reaches its step, only the dict of columns."""

    def train_step(self, columns):
        if not isinstance(columns, dict):
            raise TypeError(f"the step got {type(columns).__name__}, not the columns alone")
        wanted = tf.stack([columns[name] for name in sorted(columns)], axis=-1)
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(self(columns, training=True) - wanted))
        gradients = tape.gradient(loss, self.trainable_variables)
        self.optimizer.apply(gradients, self.trainable_variables)
        return {"reconstruction": loss}


def build_model(input_shape, num_classes, learning_rate):
    assert num_classes is None, num_classes
    inputs = {name: keras.Input(shape=shape, name=name) for name, shape in sorted(input_shape.items())}
    joined = keras.layers.Concatenate()([keras.layers.Reshape((1,))(tensor) for tensor in inputs.values()])
    outputs = keras.layers.Dense(len(inputs))(keras.layers.Dense(4, activation="relu")(joined))
    model = Reconstructs(inputs, outputs)
    model.compile(optimizer=keras.optimizers.Adam(learning_rate))
    return model
'''


@pytest.mark.slow
def test_a_table_without_a_label_column_gives_its_columns_alone_and_the_engines_step_refuses_it(
    tmp_path, tfds_data_dir
):
    rng = np.random.default_rng(0)
    table = tmp_path / "points.csv"
    table.write_text("x,y,z\n" + "".join(f"{a:.3f},{b:.3f},{a + b:.3f}\n" for a, b in rng.random((60, 2))))
    (tmp_path / "columns.py").write_text(COLUMNS)
    run = tmp_path / "run"
    result = run_train("fit", cwd=tmp_path, MODEL="columns.py", DATASET=table, LABEL_KEY="none", BATCH_SIZE=8,
                       EPOCHS=1, TFDS_DATA_DIR=tmp_path / "tfds", OUTPUT_DIR=run)  # fmt: skip
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    assert "reconstruction" in result.stdout and (run / "saved_model").is_dir()

    regression = str(REPO / "examples" / "regression.py")  # builds for num_classes None
    refused = error_line(run_train("fit", cwd=tmp_path, MODEL=regression, LABEL_KEY="none",
                                   TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=tmp_path / "engine"))  # fmt: skip
    assert refused == (
        f"error: LABEL_KEY=none gives MODEL={regression!r} its inputs alone, but the model has no train_step of its "
        "own and the engine's step fits the output to labels: override train_step(self, data) (examples/dcgan.py), "
        "or set LABEL_KEY to the label"
    )
    assert not (tmp_path / "engine").exists()


AUTOENCODER = '''
import keras, tensorflow as tf


@keras.saving.register_keras_serializable(package="autoencoder")
class AutoEncoder(keras.Model):
    """Its own train_step and test_step, each given the images alone."""

    def train_step(self, images):
        with tf.GradientTape() as tape:
            loss = tf.reduce_mean(tf.square(self(images, training=True) - images))
        self.optimizer.apply(tape.gradient(loss, self.trainable_variables), self.trainable_variables)
        return {"reconstruction": loss}

    def test_step(self, images):
        return {"reconstruction": tf.reduce_mean(tf.square(self(images) - images))}


def build_model(input_shape, num_classes, learning_rate):
    inputs = keras.Input(input_shape)
    hidden = keras.layers.Dense(4, activation="relu")(keras.layers.Flatten()(inputs))
    outputs = keras.layers.Reshape(input_shape, name="images")(keras.layers.Dense(64, activation="sigmoid")(hidden))
    model = AutoEncoder(inputs, outputs)
    model.compile(optimizer="adam")
    return model
'''


@pytest.mark.slow
def test_without_labels_evaluation_and_predict_give_the_model_its_images_alone(tmp_path, sketches_data_dir):
    (tmp_path / "autoencoder.py").write_text(AUTOENCODER)
    run = tmp_path / "run"
    settings = {"MODEL": "autoencoder.py", "DATASET": "synthetic_sketches", "LABEL_KEY": "none", "BATCH_SIZE": 8,
                "EPOCHS": 1, "TFDS_DATA_DIR": sketches_data_dir, "OUTPUT_DIR": run}  # fmt: skip
    result = run_train("fit", cwd=tmp_path, **settings)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    scored = read_summary(run)["eval"]["reconstruction"]
    evaluated = run_train("evaluate", "--exported", cwd=tmp_path, **settings)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    assert json.loads(evaluated.stdout[evaluated.stdout.index("{") :])["reconstruction"] == pytest.approx(scored)
    predicted = run_train("predict", "--split", "test", cwd=tmp_path, **settings)
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    rows = [json.loads(line) for line in predicted.stdout.splitlines() if line.startswith("{")]
    assert len(rows) == 16 and set(rows[0]) == {"input", "images"}  # the model's own output name: no label to name
    assert np.asarray(rows[0]["images"]).shape == (8, 8, 1)
