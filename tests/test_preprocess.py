"""A fork's `preprocess(example, training, seed)`: the general input path over the stored records.

The order guarantees hold with it (a new permutation each pass, disjoint replicas, a restart reads what the
uninterrupted run would), in memory and streamed, on 1 and 2 replicas; each example's seed is the same
wherever and whenever it is drawn; random crops resume exactly; what the model cannot take is refused in one
line before anything is written. TensorFlow runs in processes of their own."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import clean_env, kill_mid_run, read_summary, run_python, run_train, same_weights, start_train

# A preprocess that tells, for each example it prepares, which example it was (a hash of its stored bytes) and
# what its seed drew: what the order test reads back.
TAGGING = """
import keras
import tensorflow as tf


def preprocess(example, training, seed):
    tag = tf.strings.to_hash_bucket_fast(example["image_bytes"], 2**62)
    draw = tf.random.stateless_uniform([], seed, maxval=2**62, dtype=tf.int64)
    return {"tag": tag, "draw": draw}, example["label"]


def build_model(input_shape, num_classes, learning_rate):
    raise NotImplementedError("the order test builds no model")
"""

ORDER = """
import json, sys
from train.data import load_data
from train.data.feeds import train_dataset
from train.devices.runtime import setup_runtime
from train.model_file import load_model_file
from train.settings import load_settings

settings = load_settings()
runtime = setup_runtime(settings)
data = load_data(settings, load_model_file(settings.model))
batch = runtime.global_batch

def pipeline(start, stop):
    iterator = iter(train_dataset(runtime.strategy, data.train, batch, settings.seed, start))
    steps = []
    for _ in range(start, stop):
        inputs = next(iterator)[0]
        tags, draws = (runtime.strategy.experimental_local_results(inputs[key]) for key in ("tag", "draw"))
        steps.append([[[int(t), int(d)] for t, d in zip(tag.numpy(), draw.numpy())] for tag, draw in zip(tags, draws)])
    return steps

passes = len(data.train) // batch
json.dump({"passes": passes, "in_memory": data.in_memory, "inputs": data.spec.describe_inputs(),
           "seen": pipeline(0, 2 * passes), "resumed": pipeline(passes // 2, 2 * passes)}, open(sys.argv[1], "w"))
"""


def test_order_guarantees_and_seeds_hold_in_memory_and_streamed_on_1_and_2_replicas(tmp_path, examples_data_dir):
    model = tmp_path / "tagging.py"
    model.write_text(TAGGING)
    draws: dict[tuple[int, int], int] = {}  # (pass, example) -> what its seed drew, in every configuration
    for in_memory in ("true", "false"):
        for replicas in (1, 2):
            output = tmp_path / f"order-{in_memory}-{replicas}.json"
            env = clean_env(MODEL=model, DATASET="synthetic_images", TFDS_DATA_DIR=examples_data_dir,
                            TRAIN_SPLIT="train[:2048]", DATA_IN_MEMORY=in_memory, CPU_DEVICES=replicas,
                            BATCH_SIZE=256 // replicas)  # fmt: skip
            result = run_python(["-c", ORDER, str(output)], cwd=tmp_path, env=env)
            assert result.returncode == 0, result.stderr[-3000:]
            order = json.loads(output.read_text())
            assert order["in_memory"] == (in_memory == "true") and order["passes"] == 8
            assert order["inputs"] == "draw [] int64, tag [] int64"  # a dict in name order (examples.by_name)
            seen, passes = order["seen"], order["passes"]
            for pass_number in range(2):
                steps = seen[pass_number * passes : (pass_number + 1) * passes]
                assert all(
                    len(step) == replicas and all(len(part) == 256 // replicas for part in step) for step in steps
                )
                tags = [tag for step in steps for part in step for tag, _ in part]
                assert len(set(tags)) == len(tags) == 2048  # every example once per pass, replicas disjoint
                for step in steps:
                    for part in step:
                        for tag, draw in part:
                            assert draws.setdefault((pass_number, tag), draw) == draw, (in_memory, replicas)
            first, second = ([tag for step in seen[p * passes : (p + 1) * passes] for part in step for tag, _ in part]
                             for p in (0, 1))  # fmt: skip
            assert first != second  # each pass in a new order
            assert order["resumed"] == seen[passes // 2 :]  # a restart mid-pass reads what the first run would have
    assert len(draws) == 2 * 2048  # one seed an example a pass: the same in memory and streamed, on 1 and 2 replicas
    assert len(set(draws.values())) == len(draws)  # and a different one for every example and pass


# Random crops and flips keyed on the seed, a uint8 image returned as it is (the model scales it).
CROPPING = """
import keras
import tensorflow as tf

SIZE = 24


def preprocess(example, training, seed):
    image = example["image"]
    if training:
        crop, flip = tf.unstack(tf.random.experimental.stateless_split(seed, 2))
        image = tf.image.stateless_random_crop(image, (SIZE, SIZE, 3), crop)
        image = tf.image.stateless_random_flip_left_right(image, flip)
    else:
        image = tf.image.resize_with_crop_or_pad(image, SIZE, SIZE)
    return image, example["label"]


def build_model(input_shape, num_classes, learning_rate):
    model = keras.Sequential([
        keras.Input(input_shape, dtype="uint8"), keras.layers.Rescaling(1 / 255),
        keras.layers.Conv2D(16, 3, activation="relu"), keras.layers.GlobalAveragePooling2D(),
        keras.layers.Dense(num_classes, activation="softmax"),
    ])
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model
"""


def cropping_settings(tmp_path: Path, data_dir: Path, replicas: int, in_memory: str) -> dict[str, object]:
    model = tmp_path / "cropping.py"
    model.write_text(CROPPING)
    return {
        "MODEL": model, "DATASET": "synthetic_images", "TFDS_DATA_DIR": data_dir, "TRAIN_SPLIT": "train[:1024]",
        "EVAL_SPLIT": "test[:256]", "EPOCHS": 2, "BATCH_SIZE": 32 // replicas, "CPU_DEVICES": replicas,
        "DATA_IN_MEMORY": in_memory, "CHECKPOINT_EVERY": 4, "STEPS_PER_CALL": 4, "LEARNING_RATE": 0.01,
    }  # fmt: skip


def train_cropping(tmp_path: Path, data_dir: Path, replicas: int, in_memory: str) -> Path:
    """The cropping model trained start to end, uninterrupted, in tmp_path / "straight"."""
    straight = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "straight",
                         **cropping_settings(tmp_path, data_dir, replicas, in_memory))  # fmt: skip
    assert straight.returncode == 0, straight.stderr[-3000:]
    assert "as the stored records, each preprocessed in tf.data" in straight.stdout
    assert read_summary(tmp_path / "straight")["eval"]["accuracy"] > 0.2  # 10 classes: chance is 0.1
    return tmp_path / "straight"


@pytest.fixture(scope="module")
def cropping_on_one_device(tmp_path_factory, examples_data_dir) -> Path:
    """The cropping model trained on one device, in memory: the reference of the resume on 1 replica and of
    the 2 workers below (the same settings: CHECKPOINT_EVERY changes what is saved, not what is trained)."""
    return train_cropping(tmp_path_factory.mktemp("cropping"), examples_data_dir, 1, "true")


@pytest.mark.slow
@pytest.mark.parametrize(("replicas", "in_memory"), [(1, "true"), (2, "false")])
def test_random_crops_resume_exactly_after_sigkill(request, tmp_path, examples_data_dir, replicas, in_memory):
    if (replicas, in_memory) == (1, "true"):
        straight = request.getfixturevalue("cropping_on_one_device")
    else:
        straight = train_cropping(tmp_path, examples_data_dir, replicas, in_memory)
    reference = read_summary(straight)
    settings = cropping_settings(tmp_path, examples_data_dir, replicas, in_memory)

    output_dir = tmp_path / "killed"
    process = start_train("fit", cwd=tmp_path, OUTPUT_DIR=output_dir, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, **settings)  # fmt: skip
    kill_mid_run(process, output_dir)
    resumed = run_train("fit", cwd=tmp_path, OUTPUT_DIR=output_dir, **settings)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = read_summary(output_dir)
    assert 0 < summary["resumed_from_step"] < summary["steps"]
    assert summary["weights_sha256"] == reference["weights_sha256"]
    assert same_weights(output_dir / "model.keras", straight / "model.keras")


BAD = {
    "a variable shape": ("return example['image'][: 1 + seed[1] % 8], example['label']",
                         "preprocess(training=True) returns inputs of variable shape (None, 32, 3)"),
    "a string": ("return example['image_bytes'], example['label']",
                 "preprocess(training=True) returns inputs as strings"),
    "keys the model does not name": ("return {'pixels': tf.image.resize(example['image'], (8, 8))}, example['label']",
                                     "preprocess returns inputs ['pixels'] but the model's keras.Input names are "
                                     "['image']"),
    "not (inputs, label)": ("return example['image']",
                            "preprocess(training=True) returns one value, not (inputs, label)"),
    "an exception": ("raise ValueError('no such column: colour')",
                     "preprocess (training=True) raised ValueError: no such column: colour"),
}  # fmt: skip

BAD_MODEL = """
import keras
import tensorflow as tf


def preprocess(example, training, seed):
    {body}


def build_model(input_shape, num_classes, learning_rate):
    inputs = keras.Input((8, 8, 3), name="image")
    model = keras.Model(inputs, keras.layers.Dense(num_classes)(keras.layers.Flatten()(inputs)))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model
"""


@pytest.mark.parametrize("case", list(BAD))
def test_a_preprocess_the_model_cannot_take_is_one_line_and_exit_2_before_anything_is_written(
    tmp_path, examples_data_dir, case
):
    body, said = BAD[case]
    model = tmp_path / "bad.py"
    model.write_text(BAD_MODEL.format(body=body))
    result = run_train("fit", cwd=tmp_path, MODEL=model, DATASET="synthetic_images", TFDS_DATA_DIR=examples_data_dir,
                       OUTPUT_DIR=tmp_path / "run")  # fmt: skip
    assert result.returncode == 2, result.stdout[-2000:] + result.stderr[-3000:]
    error = result.stderr.strip().splitlines()[-1]  # (TensorFlow's C++ start-up lines come before it)
    assert error.startswith("error: ") and said in error, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


def test_a_variable_shape_feature_without_preprocess_says_to_define_it(tmp_path, photos_data_dir):
    result = run_train("fit", cwd=tmp_path, MODEL="examples.cnn", DATASET="synthetic_photos",
                       TFDS_DATA_DIR=photos_data_dir, OUTPUT_DIR=tmp_path / "run")  # fmt: skip
    assert result.returncode == 2
    assert "has a variable shape (None, None, 3): define preprocess in your MODEL file" in result.stderr
    assert "examples/resnet.py" in result.stderr
    assert not (tmp_path / "run").exists()


RESIZING = """
import keras
import tensorflow as tf


def preprocess(example, training, seed):
    image = keras.layers.Resizing(16, 16)(tf.image.convert_image_dtype(example["image"], tf.float32))
    return image, example["label"]


def build_model(input_shape, num_classes, learning_rate):
    model = keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(),
                              keras.layers.Dense(num_classes, activation="softmax", dtype="float32")])
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"])
    return model
"""


def test_a_mixed_precision_policy_never_changes_what_preprocess_returns(tmp_path, examples_data_dir):
    """Under mixed_bfloat16 a Keras Resizing layer in a tf.data map outputs bfloat16: made while preprocess is
    traced, it computes in float32, so the model gets what preprocess returns without the policy."""
    model = tmp_path / "resizing.py"
    model.write_text(RESIZING)
    result = run_train("fit", cwd=tmp_path, MODEL=model, DATASET="synthetic_images", TFDS_DATA_DIR=examples_data_dir,
                       TRAIN_SPLIT="train[:512]", EVAL_SPLIT="test[:128]", EPOCHS=1, BATCH_SIZE=64,
                       MIXED_PRECISION="mixed_bfloat16", OUTPUT_DIR=tmp_path / "run")  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "mixed_bfloat16" in result.stdout
    layer = next(line for line in result.stdout.splitlines() if "flatten" in line.lower())
    assert "768" in layer  # 16 x 16 x 3 float32 values reached the model
    describe = run_python(["-c", "from train.data import load_data\nfrom train.devices.runtime import setup_runtime\n"
                                 "from train.settings import load_settings\ns = load_settings()\nsetup_runtime(s)\n"
                                 "from train.model_file import load_model_file\n"
                                 "print(load_data(s, load_model_file(s.model)).spec.describe_inputs())"], cwd=tmp_path,
                          env=clean_env(MODEL=model, DATASET="synthetic_images", TFDS_DATA_DIR=examples_data_dir,
                                        MIXED_PRECISION="mixed_bfloat16"))  # fmt: skip
    assert describe.returncode == 0, describe.stderr[-3000:]
    assert describe.stdout.strip().splitlines()[-1] == "inputs [16, 16, 3] float32"


RELATIVE_DIFFERENCE = """
import sys, numpy as np, keras
a, b = (keras.saving.load_model(path) for path in sys.argv[1:3])
x, y = (np.concatenate([w.ravel() for w in m.get_weights()]) for m in (a, b))
print(float(np.linalg.norm(x - y) / np.linalg.norm(x)))
"""


@pytest.mark.slow
def test_two_workers_draw_the_crops_one_device_draws_and_end_where_it_does(
    tmp_path, examples_data_dir, cropping_on_one_device
):
    """In memory, 2 workers read the global batches 1 device reads, and each example's seed depends on its
    place in the split alone: the same crops, so the same training up to the all-reduce's summation order."""
    from tests.test_multi_worker import run_workers

    one = cropping_on_one_device
    settings = cropping_settings(tmp_path, examples_data_dir, 1, "true")
    settings.update(CHECKPOINT_EVERY=1000, STEPS_PER_EPOCH=None, BATCH_SIZE=16)
    del settings["TFDS_DATA_DIR"]  # run_workers sets it
    workers = run_workers(tmp_path, [{}, {}], examples_data_dir, **settings)
    assert [code for code, _ in workers] == [0, 0], workers[0][1][-3000:] + workers[1][1][-3000:]
    assert "on 2 workers" in workers[0][1] and "as the stored records, each preprocessed in tf.data" in workers[0][1]
    reference, both = read_summary(one), read_summary(tmp_path / "run")
    assert (both["workers"], both["global_batch"], both["steps"]) == (2, 32, reference["steps"])
    assert abs(both["eval"]["accuracy"] - reference["eval"]["accuracy"]) <= 0.002
    difference = run_python(
        ["-c", RELATIVE_DIFFERENCE, str(one / "model.keras"), str(tmp_path / "run" / "model.keras")]
    )
    assert difference.returncode == 0, difference.stderr[-2000:]
    assert float(difference.stdout.strip().splitlines()[-1]) < 1e-3
