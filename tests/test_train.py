"""End-to-end training in real processes, on CPU, split into logical devices where it says so."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import kill_mid_run, read_summary, run_python, run_train, start_train

QUICK = {"EPOCHS": 2, "STEPS_PER_EPOCH": 40, "CHECKPOINT_EVERY": 25, "LOG_EVERY": 20}


def fit(tmp_path: Path, data_dir: Path, fresh: bool = False, **settings: object
        ) -> tuple[subprocess.CompletedProcess, Path]:  # fmt: skip
    output_dir = tmp_path / "run"
    tmp_path.mkdir(exist_ok=True)
    settings = {"JIT_COMPILE": None, **settings}  # the engine's default (auto): this file tests the default fit
    result = run_train("fit", cwd=tmp_path, TFDS_DATA_DIR=data_dir, OUTPUT_DIR=output_dir, fresh=fresh, **settings)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return result, output_dir


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory, tfds_data_dir) -> tuple[subprocess.CompletedProcess, Path]:
    """`fit` as a user types it (a new interpreter, TensorFlow imported in it), QUICK: trained once for the tests
    that only read it."""
    return fit(tmp_path_factory.mktemp("quick"), tfds_data_dir, fresh=True, **QUICK)


def test_fit_as_a_user_types_it_trains_checkpoints_and_exports(quick_run):
    result, run = quick_run
    summary = read_summary(run)
    assert summary["dataset"] == "synthetic_clusters/1.0.0"
    assert (summary["strategy"], summary["replicas"], summary["global_batch"]) == ("one_device", 1, 128)
    assert (summary["steps"], summary["epochs_completed"], summary["resumed_from_step"]) == (80, 2, None)
    assert summary["eval"]["accuracy"] > 0.5  # 10 classes: chance is 0.1
    assert summary["examples_per_sec"] > 0
    assert summary["checkpoint"].endswith("ckpt-80")
    assert (run / "model.keras").is_file() and (run / "saved_model" / "saved_model.pb").is_file()
    assert json.loads((run / "settings.json").read_text())["STEPS_PER_EPOCH"] == "40"
    assert list((run / "logs" / "train").iterdir()) and list((run / "logs" / "eval").iterdir())
    assert "No GPU found: training on CPU." in result.stdout
    assert "step      80/80" in result.stdout
    # TensorFlow's two libraries print the same C++ start-up notice: shown once
    assert result.stderr.count("All log messages before absl::InitializeLog() is called") <= 1


@pytest.mark.parametrize("replicas", [2, 4])
def test_mirrored_over_logical_cpus_trains_with_the_global_batch(tmp_path, tfds_data_dir, replicas):
    _, run = fit(tmp_path, tfds_data_dir, CPU_DEVICES=replicas, BATCH_SIZE=32, EPOCHS=2)
    summary = read_summary(run)
    assert (summary["strategy"], summary["replicas"]) == ("mirrored", replicas)
    assert (summary["per_replica_batch"], summary["global_batch"]) == (32, 32 * replicas)
    assert summary["steps_per_epoch"] == 16384 // (32 * replicas)  # one pass over the train split
    assert summary["eval"]["accuracy"] > 0.7


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"MIXED_PRECISION": "mixed_bfloat16"}, ("mixed_bfloat16", None, True)),
        # float16 under MirroredStrategy: Keras's LossScaleOptimizer scales the loss and unscales the gradients.
        ({"MIXED_PRECISION": "mixed_float16", "CPU_DEVICES": 2}, ("mixed_float16", "reduce_to_one", False)),
        ({"CROSS_DEVICE_OPS": "hierarchical_copy", "CPU_DEVICES": 2}, ("float32", "hierarchical_copy", False)),
    ],
)
def test_precision_and_all_reduce_levers_train(tmp_path, tfds_data_dir, settings, expected):
    _, run = fit(tmp_path, tfds_data_dir, EPOCHS=1, BATCH_SIZE=64, **settings)
    summary = read_summary(run)
    assert (summary["precision"], summary["cross_device_ops"], summary["jit_compile"]) == expected
    assert summary["eval"]["accuracy"] > 0.5


def test_same_global_batch_learns_the_same_on_one_or_two_replicas(tmp_path, tfds_data_dir):
    _, one = fit(tmp_path / "one", tfds_data_dir, BATCH_SIZE=64, **QUICK)
    _, two = fit(tmp_path / "two", tfds_data_dir, BATCH_SIZE=32, CPU_DEVICES=2, **QUICK)
    loss_one, loss_two = read_summary(one)["eval"]["loss"], read_summary(two)["eval"]["loss"]
    assert loss_two == pytest.approx(loss_one, rel=1e-3)  # gradients summed over replicas = one big batch


@pytest.mark.slow
def test_run_killed_mid_training_resumes_and_ends_at_the_uninterrupted_step_count(tmp_path, tfds_data_dir):
    output_dir = tmp_path / "run"
    settings = {"TFDS_DATA_DIR": tfds_data_dir, "OUTPUT_DIR": output_dir, "BATCH_SIZE": 16, "EPOCHS": 3}
    settings |= {"STEPS_PER_CALL": 4, "CHECKPOINT_EVERY": 40, "KEEP_CHECKPOINTS": 2, "LOG_EVERY": 1000}
    process = start_train("fit", cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, **settings)
    kill_mid_run(process, output_dir, settle=0.5)

    result = run_train("fit", cwd=tmp_path, **settings)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(output_dir)
    assert summary["resumed_from_step"] > 0
    assert "Resuming from" in result.stdout
    assert summary["steps"] == summary["total_steps"] == 3 * (16384 // 16)


def test_resume_never_refuses_a_directory_with_checkpoints(tmp_path, tfds_data_dir, quick_run):
    _, run = quick_run
    before = sorted(p.name for p in (run / "checkpoints").iterdir())
    result = run_train("fit", cwd=tmp_path, TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=run, RESUME="never", **QUICK)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: RESUME=never but OUTPUT_DIR=")
    assert "Traceback" not in result.stderr
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before


def test_finished_run_started_again_trains_no_further(tmp_path, tfds_data_dir, quick_run):
    shutil.copytree(quick_run[1], tmp_path / "run")  # a copy of the finished QUICK run, started again
    first = read_summary(tmp_path / "run")
    result, run = fit(tmp_path, tfds_data_dir, **QUICK)
    again = read_summary(run)
    assert again["steps"] == first["steps"] == 80
    assert again["resumed_from_step"] == 80
    assert again["eval"] == first["eval"]
    assert (
        "already at step 80 of 80 (EPOCHS=2 x 40; the steps taken count, at whatever batch size): "
        "nothing to train, evaluating again"
    ) in result.stdout
    assert "warning: resuming with settings changed" not in result.stdout
    assert "XLA on (auto: as this run's first start decided)" in result.stdout  # decided once, kept on resume


def test_resuming_with_other_run_defining_settings_says_which_changed(tmp_path, tfds_data_dir):
    fit(tmp_path, tfds_data_dir, **{**QUICK, "EPOCHS": 1})
    result, run = fit(tmp_path, tfds_data_dir, **QUICK, BATCH_SIZE=64, SEED=7)
    assert (
        "warning: resuming with settings changed since this run directory's last start: "
        "BATCH_SIZE 128 -> 64, SEED 42 -> 7. The steps taken stay"
    ) in result.stdout
    assert read_summary(run)["resumed_from_step"] == 40


def test_evaluate_checkpoint_and_exported_model_agree_with_the_summary(tmp_path, tfds_data_dir, quick_run):
    _, run = quick_run
    expected = read_summary(run)["eval"]["accuracy"]
    for args in (["evaluate"], ["evaluate", "--exported"]):
        result = run_train(*args, cwd=tmp_path, TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=run)
        assert result.returncode == 0, result.stderr[-3000:]
        report = json.loads(result.stdout[result.stdout.index("{") :])
        assert report["accuracy"] == pytest.approx(expected)
        assert report["examples"] == 2048
        assert "WARNING:tensorflow" not in result.stderr  # e.g. about checkpoint values left unrestored


def test_unknown_dataset_is_one_line_with_the_closest_names(tmp_path, tfds_data_dir):
    result = run_train("fit", cwd=tmp_path, TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=tmp_path / "run", DATASET="mnistt")
    assert result.returncode == 2
    assert (
        result.stderr.strip()
        .splitlines()[-1]
        .startswith("error: DATASET='mnistt' is not a TFDS dataset: did you mean mnist")
    )
    assert not (tmp_path / "run").exists()


def test_unknown_split_names_the_splits_that_exist(tmp_path, tfds_data_dir):
    result = run_train(
        "fit", cwd=tmp_path, TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=tmp_path / "run", EVAL_SPLIT="validation"
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: EVAL_SPLIT='validation' is not a split of synthetic_clusters/1.0.0: use one of train, test"
    )


def test_real_dataset_name_under_tfds_mock_data(tmp_path):
    """`tfds.testing.mock_data` fakes MNIST's examples (random, with MNIST's features): no download."""
    script = (
        "import json, sys, tensorflow_datasets as tfds\n"
        "from train.fit import fit\n"
        "from train.signals import StopRequest\n"
        "from train.settings import load_settings\n"
        "with tfds.testing.mock_data(num_examples=256), StopRequest() as stop:\n"
        "    flags = {'DATASET': 'mnist', 'OUTPUT_DIR': sys.argv[1], 'EPOCHS': '1', 'BATCH_SIZE': '32'}\n"
        "    settings = load_settings(flags)\n"
        "    fit(settings, stop, say=lambda message: None)\n"
    )
    result = run_python(["-c", script, str(tmp_path / "run")], cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(tmp_path / "run")
    assert summary["dataset"].startswith("mnist/")
    assert summary["steps"] == 256 // 32
    assert summary["eval"] is not None


TINY_IMAGES = '''
import numpy as np
import tensorflow_datasets as tfds

class TinyImages(tfds.core.GeneratorBasedBuilder):
    """4x4 grey images, 3 classes, and no supervised_keys: the template must default to image/label."""
    VERSION = tfds.core.Version("0.1.0")

    def _info(self):
        return self.dataset_info_from_configs(features=tfds.features.FeaturesDict({
            "image": tfds.features.Image(shape=(4, 4, 1)), "label": tfds.features.ClassLabel(num_classes=3)}))

    def _split_generators(self, dl_manager):
        return {"train": self._generate_examples(96), "test": self._generate_examples(30)}

    def _generate_examples(self, count):
        for i in range(count):
            yield i, {"image": np.full((4, 4, 1), 80 * (i % 3), np.uint8), "label": i % 3}
'''


def test_dataset_prepared_in_a_data_dir_trains_offline_without_its_builder_code(tmp_path):
    data_dir, builders = tmp_path / "data", tmp_path / "builders"
    (builders / "tiny_images").mkdir(parents=True)  # TFDS wants a builder to live in a package
    (builders / "tiny_images" / "__init__.py").write_text(TINY_IMAGES)
    prepare = "import sys, tiny_images; tiny_images.TinyImages(data_dir=sys.argv[1]).download_and_prepare()"
    assert run_python(["-c", prepare, str(data_dir)], cwd=builders).returncode == 0
    _, run = fit(tmp_path, data_dir, DATASET="tiny_images", BATCH_SIZE=8, EPOCHS=3)
    summary = read_summary(run)
    assert summary["dataset"] == "tiny_images/0.1.0"
    assert summary["steps"] == 3 * (96 // 8)


def test_calls_end_at_every_log_checkpoint_and_epoch_step_and_at_the_end():
    from train.loop import call_steps
    from train.settings import load_settings

    settings = load_settings({"STEPS_PER_CALL": "32", "LOG_EVERY": "50", "CHECKPOINT_EVERY": "100"})
    lengths, step = [], 0
    while step < 300:
        lengths.append(call_steps(settings, step, steps_per_epoch=128, total_steps=300))
        step += lengths[-1]
    assert lengths == [32, 18, 32, 18, 28, 22, 32, 18, 32, 18, 6, 32, 12]  # none longer than STEPS_PER_CALL
    ends = {sum(lengths[: index + 1]) for index in range(len(lengths))}
    assert {50, 100, 128, 150, 200, 250, 256, 300} <= ends


@pytest.mark.parametrize("steps_per_call", ["32", "100000000000000000000"])
def test_the_feed_plans_for_the_longest_call_fit_makes_not_for_steps_per_call(steps_per_call):
    """A huge STEPS_PER_CALL once made the feed plan millions of passes ahead (all memory); calls are cut anyway."""
    from train.loop import call_steps, longest_call
    from train.settings import load_settings

    settings = load_settings({"STEPS_PER_CALL": steps_per_call, "LOG_EVERY": "50", "CHECKPOINT_EVERY": "100"})
    lengths, step = [], 0
    while step < 1000:
        lengths.append(call_steps(settings, step, steps_per_epoch=40, total_steps=1000))
        step += lengths[-1]
    assert longest_call(settings, steps_per_epoch=40) == max(lengths) == min(int(steps_per_call), 40)


BRANCHING_MODEL = '''
import keras
import tensorflow as tf
from keras import layers


@keras.saving.register_keras_serializable()  # so model.keras loads with safe_mode (the export is tried first)
class Branching(layers.Layer):
    """`if` on a tensor's value: in a graph this needs autograph (a tf.function's: Keras builds the model by
    running it in a graph of its own, outside the loop's trace)."""

    @tf.function
    def call(self, features):
        if keras.ops.mean(features) > 100.0:
            return features * 0.0
        return features

    def compute_output_spec(self, features):  # a new tensor: the input itself would make model.keras a cycle
        return keras.KerasTensor(features.shape, features.dtype)


def build_model(input_shape, num_classes, learning_rate):
    model = keras.Sequential(
        [keras.Input(shape=input_shape), Branching(), layers.Dense(num_classes, activation="softmax")]
    )
    model.compile(keras.optimizers.Adam(learning_rate), "sparse_categorical_crossentropy", metrics=["accuracy"])
    return model
'''


def test_a_model_with_python_branches_on_tensors_trains(tmp_path, tfds_data_dir):
    """The loop is traced without autograph; a layer's own `if tensor:` still works."""
    (tmp_path / "branching.py").write_text(BRANCHING_MODEL)
    result = run_train(
        "fit", cwd=tmp_path, MODEL="branching.py", TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=tmp_path / "run",
        EPOCHS=1, STEPS_PER_EPOCH=5,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_summary(tmp_path / "run")["steps"] == 5


TINY_MODEL = """\
import keras


def build_model(input_shape, num_classes, learning_rate):
    inputs = {name: keras.Input(input_shape[name], name=name) for name in sorted(input_shape)}
    x = keras.layers.Concatenate()([keras.layers.Reshape((1,))(inputs[name]) for name in sorted(inputs)])
    model = keras.Model(inputs, keras.layers.Dense(num_classes)(x))
    model.compile(keras.optimizers.SGD(learning_rate), keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model
"""


@pytest.mark.slow
def test_a_run_fitted_with_relative_paths_is_evaluated_and_resumed_from_another_directory(tmp_path):
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    (project / "data").mkdir(parents=True)
    elsewhere.mkdir()
    (project / "model.py").write_text(TINY_MODEL)
    (project / "data/rows.csv").write_text("a,b,label\n" + "".join(f"{i % 7},{i % 3},{i % 2}\n" for i in range(64)))
    given = {"EPOCHS": 1, "BATCH_SIZE": 16, "EVAL_SPLIT": "train", "TFDS_DATA_DIR": tmp_path / "tfds"}
    first = run_train("fit", cwd=project, MODEL="model.py", DATASET="data/rows.csv", OUTPUT_DIR="runs/a", **given)
    assert first.returncode == 0, first.stderr[-3000:]
    run = project / "runs/a"
    recorded = json.loads((run / "settings.json").read_text())
    assert (recorded["MODEL"], recorded["DATASET"]) == (str(project / "model.py"), str(project / "data/rows.csv"))
    assert json.loads((run / "run.json").read_text())["model"] == str(project / "model.py")
    scored = run_train("evaluate", "--output-dir", str(run), cwd=elsewhere, MODEL=None)
    assert scored.returncode == 0, scored.stderr[-3000:]
    assert json.loads(scored.stdout[scored.stdout.index("{") :])["examples"] == 64
    resumed = run_train("fit", "--output-dir", str(run), "--epochs", "2", cwd=elsewhere, MODEL=None)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert read_summary(run)["epochs_completed"] == 2
