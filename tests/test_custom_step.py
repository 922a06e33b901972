"""A model's own train_step and test_step: they are the steps (never bypassed), they match Keras's `model.fit` of
the same model on the same batches (1 device, 2 replicas; 2 workers match 2 replicas), several optimizers are
built, checkpointed and resumed exactly, and what the engine cannot run is refused in one line."""

from __future__ import annotations

import json
import subprocess
import time

import pytest

from tests.conftest import REPO, clean_env, read_summary, run_python, run_train, start_python, start_train
from train.cluster.launch import free_ports, tf_configs

# A marker on the guide's step: counts its own calls (a Sum metric, on each replica) and adds a loss term whose
# only effect is on the weights (so a bypassed step would train other weights and log no "calls").
COUNTED = '''
import keras, tensorflow as tf
from examples.custom_step import build_model as guide_model

class Counted(keras.Model):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.calls = keras.metrics.Sum(name="calls")

    def train_step(self, data):
        logs = super().train_step(data)
        self.calls.update_state(1.0)
        return {**logs, "calls": self.calls.result()}

    def test_step(self, data):
        x, y = data
        self.calls.update_state(tf.cast(tf.shape(y)[0], tf.float32))  # counts the examples it scores
        return {"calls": self.calls.result()}

def build_model(input_shape, num_classes, learning_rate):
    guide = guide_model(input_shape, num_classes, learning_rate)
    model = Counted(guide.inputs, guide.outputs)
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss="sparse_categorical_crossentropy")
    return model
'''
SMALL = {"TRAIN_SPLIT": "train[:512]", "EVAL_SPLIT": "test[:200]", "EPOCHS": 2, "GLOBAL_BATCH_SIZE": 64, "STEPS_PER_CALL": 4}


def harness(*args: str, **env: object) -> dict:
    result = run_python(["-m", "tests.harness.custom_steps", *args], cwd=REPO, env=clean_env(**env))
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("replicas", [1, 2])
def test_a_custom_train_step_trains_and_logs_what_model_fit_of_the_same_model_does(replicas):
    """examples/custom_step.py, 8 steps at a global batch of 64, against Keras's fit under the same strategy."""
    outcome = harness("fit", str(replicas))
    assert outcome["moved"] > 0.1  # the weights did train
    assert outcome["max_difference"] < 1e-5
    assert set(outcome["engine"]) == {"loss", "accuracy", "gradient_norm"}  # the nested compile_metrics flattened
    assert outcome["engine"] == pytest.approx(outcome["fit"], rel=1e-5)


@pytest.mark.slow
def test_a_custom_train_step_on_two_workers_ends_where_two_replicas_on_one_worker_do():
    """Keras's fit cannot run on 2 workers (keras#20585): 2 workers of 1 CPU against 1 worker of 2."""
    one = harness("engine", CPU_DEVICES=2)
    processes = [
        start_python(["-m", "tests.harness.custom_steps", "engine"], cwd=REPO, env=clean_env(TF_CONFIG=config),
                     stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)  # fmt: skip
        for config in tf_configs(free_ports(2))
    ]
    try:
        outputs = [process.communicate(timeout=240) for process in processes]
    finally:
        for process in processes:
            process.kill()
    assert [process.returncode for process in processes] == [0, 0], [err[-2000:] for _, err in outputs]
    chief, other = (json.loads(out.strip().splitlines()[-1]) for out, _ in outputs)
    assert (chief["workers"], chief["replicas"], one["replicas"]) == (2, 2, 2)
    assert chief["sha"] == other["sha"]
    difference = max(abs(a - b) for a, b in zip(_flat(chief["weights"]), _flat(one["weights"]), strict=True))
    assert difference < 1e-5
    assert chief["metrics"] == pytest.approx(one["metrics"], rel=1e-5)


def _flat(value) -> list[float]:
    return [x for item in value for x in _flat(item)] if isinstance(value, list) else [value]


@pytest.mark.parametrize("replicas", [1, 2])
def test_an_overridden_train_step_and_test_step_are_the_steps_fit_runs(replicas, tmp_path, tfds_data_dir):
    """Fails if the engine ever bypasses them again: every call is counted, in the logs every run writes."""
    (tmp_path / "counted.py").write_text(COUNTED)
    output_dir = tmp_path / "run"
    result = run_train("fit", cwd=tmp_path, MODEL="counted.py", TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=output_dir,
                       CPU_DEVICES=replicas, **SMALL)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    epochs = json.loads((output_dir / "epochs.json").read_text())
    assert [epoch["logs"]["calls"] for epoch in epochs] == [8.0, 8.0]  # 512 / 64 steps an epoch, on each replica
    assert {"loss", "calls", "val_calls"} <= set(epochs[0]["logs"])
    assert "step       8/16" in result.stdout and "calls 8.0000" in result.stdout
    summary = read_summary(output_dir)
    # test_step saw every example once, whatever the replicas: a metric's result over the whole split
    assert summary["eval"] == {"calls": 200.0}
    assert summary["train"] == {"calls": 512.0}


GAN = {"MODEL": str(REPO / "examples" / "gan.py"), "DATASET": "synthetic_images", "TRAIN_SPLIT": "train[:256]",
       "EPOCHS": 3, "GLOBAL_BATCH_SIZE": 32, "STEPS_PER_CALL": 2, "CHECKPOINT_EVERY": 4, "LOG_EVERY": 4}  # fmt: skip

CHECKPOINTED = """
import sys, tensorflow as tf
names = [name for name, _ in tf.train.list_variables(tf.train.latest_checkpoint(sys.argv[1]))]
reader = tf.train.load_checkpoint(tf.train.latest_checkpoint(sys.argv[1]))
for optimizer in ("d_optimizer", "g_optimizer"):
    [iterations] = [n for n in names if n.startswith(f"model/{optimizer}/") and "iterations" in n]
    print(optimizer, int(reader.get_tensor(iterations)), sum(n.startswith(f"model/{optimizer}/") for n in names))
"""


@pytest.mark.slow
@pytest.mark.parametrize("replicas", [1, 2])
def test_the_gan_trains_both_optimizers_checkpoints_them_and_resumes_exactly_after_sigkill(
    replicas, tmp_path, examples_data_dir
):
    settings = {**GAN, "TFDS_DATA_DIR": examples_data_dir, "CPU_DEVICES": replicas}
    whole = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "whole", **settings)
    assert whole.returncode == 0, whole.stderr[-3000:]
    summary = read_summary(tmp_path / "whole")
    assert summary["eval"] == {} and summary["train"] == {}  # no compiled loss, no test_step: not evaluated
    assert "d_loss" in whole.stdout and "g_loss" in whole.stdout
    said = run_python(["-c", CHECKPOINTED, str(tmp_path / "whole" / "checkpoints")])
    assert said.returncode == 0, said.stderr[-2000:]
    for line in said.stdout.strip().splitlines()[-2:]:
        name, iterations, variables = line.split()
        assert int(iterations) == summary["steps"] and int(variables) > 2, line  # applied every step, slots saved

    output_dir = tmp_path / "killed"
    process = start_train("fit", cwd=tmp_path, OUTPUT_DIR=output_dir, **settings)
    while not list((output_dir / "checkpoints").glob("ckpt-8.index")) and process.poll() is None:
        time.sleep(0.05)
    process.kill()
    process.communicate()
    rerun = run_train("fit", cwd=tmp_path, OUTPUT_DIR=output_dir, **settings)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    resumed = read_summary(output_dir)
    assert resumed["resumed_from_step"] and resumed["resumed_from_step"] >= 8
    assert resumed["weights_sha256"] == summary["weights_sha256"]
    exported = run_python(["-c", "import sys, keras; m = keras.saving.load_model(sys.argv[1]); print(m.name, "
                           "m.output.shape)", str(output_dir / "model.keras")])  # fmt: skip
    assert exported.stdout.strip().splitlines()[-1] == "generator (None, 32, 32, 3)"  # export_model's model
