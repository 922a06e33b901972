"""A model's own train_step and test_step: they are the steps (never bypassed), they match Keras's `model.fit` of
the same model on the same batches (1 device, 2 replicas; 2 workers match 2 replicas), several optimizers are
built, checkpointed and resumed exactly, and what the engine cannot run is refused in one line."""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.conftest import (
    HARNESS_CWD,
    REPO,
    clean_env,
    kill_mid_run,
    read_summary,
    run_python,
    run_train,
    start_python,
    start_train,
    tensorboard_events,
    wait_for,
)
from tests.harness.build_each import BUILD_EACH
from train.cluster.launch import free_ports, tf_configs

# A marker on the guide's step: counts its own calls (a Sum metric, on each replica) and adds a loss term whose
# only effect is on the weights (so a bypassed step would train other weights and log no "calls").
COUNTED = """
import keras, tensorflow as tf
from examples.custom_step import build_model as guide_model

@keras.saving.register_keras_serializable(package="counted")
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
"""
SMALL = {
    "TRAIN_SPLIT": "train[:512]",
    "EVAL_SPLIT": "test[:200]",
    "EPOCHS": 2,
    "GLOBAL_BATCH_SIZE": 64,
    "STEPS_PER_CALL": 4,
}


def harness(*args: str, **env: object) -> dict:
    result = run_python(["-m", "tests.harness.custom_steps", *args], cwd=HARNESS_CWD, env=clean_env(**env))
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize(("replicas", "xla"), [(1, ""), (2, ""), (1, "xla")])
def test_a_custom_train_step_trains_and_logs_what_model_fit_of_the_same_model_does(replicas, xla):
    """examples/custom_step.py, 8 steps at a global batch of 64 in calls of 4, against Keras's fit (one step a
    call, no XLA) under the same strategy. XLA on 1 device (on mirrored CPU devices it cannot compile any step)."""
    outcome = harness("fit", str(replicas), *([xla] if xla else []))
    assert outcome["moved"] > 0.1  # the weights did train
    assert outcome["max_difference"] < (1e-4 if xla else 1e-5)  # XLA fuses the float math in another order
    assert set(outcome["engine"]) == {"loss", "accuracy", "gradient_norm"}  # the nested compile_metrics flattened
    assert outcome["engine"] == pytest.approx(outcome["fit"], rel=1e-5)


@pytest.mark.slow
def test_a_custom_train_step_on_two_workers_ends_where_two_replicas_on_one_worker_do():
    """Keras's fit cannot run on 2 workers (keras#20585): 2 workers of 1 CPU against 1 worker of 2."""
    one = harness("engine", CPU_DEVICES=2)
    processes = [
        start_python(
            ["-m", "tests.harness.custom_steps", "engine"],
            cwd=HARNESS_CWD,
            env=clean_env(TF_CONFIG=config),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
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
                        JIT_COMPILE=None,  # auto: what it decides for a model's own train_step is asserted
                       CPU_DEVICES=replicas, **SMALL)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    epochs = json.loads((output_dir / "epochs.json").read_text())
    assert [epoch["logs"]["calls"] for epoch in epochs] == [8.0, 8.0]  # 512 / 64 steps an epoch, on each replica
    assert {"loss", "calls", "val_calls"} <= set(epochs[0]["logs"])
    assert "step       8/16" in result.stdout and "calls 8.0000" in result.stdout
    xla = {1: "XLA off (auto: off, as model.fit runs this model's own train_step (its jit_compile is False))",
           2: "XLA off (auto: XLA cannot compile a step mirrored on CPU devices)"}  # fmt: skip
    assert xla[replicas] in result.stdout, result.stdout[-3000:]
    summary = read_summary(output_dir)
    # test_step saw every example once, whatever the replicas: a metric's result over the whole split
    assert summary["eval"] == {"calls": 200.0}
    assert summary["train"] == {"calls": 512.0}
    assert tensorboard_events(output_dir / "logs")["eval"] == {"calls": 200.0}
    exported = run_train(
        "evaluate",
        "--exported",
        cwd=tmp_path,
        OUTPUT_DIR=output_dir,
        MODEL="counted.py",
        TFDS_DATA_DIR=tfds_data_dir,
        **SMALL,
        CPU_DEVICES=replicas,
    )  # the MODEL file imported first
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert json.loads(exported.stdout[exported.stdout.index("{") :])["calls"] == 200.0


def test_an_overridden_test_step_alone_is_evaluations_step(tmp_path, tfds_data_dir):
    """The engine's own train_step (the compiled loss), the model's test_step: it counts what it scores."""
    test_step_only = COUNTED.replace("    def train_step(self, data):", "    def _unused(self, data):")
    (tmp_path / "counted.py").write_text(test_step_only)
    output_dir = tmp_path / "run"
    result = run_train("fit", cwd=tmp_path, MODEL="counted.py", TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=output_dir,
                        JIT_COMPILE=None,  # auto: what it decides for a model's own train_step is asserted
                       **SMALL)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    logs = json.loads((output_dir / "epochs.json").read_text())[0]["logs"]
    assert set(logs) == {"loss", "calls", "val_calls"}  # the engine's step reports the compiled loss and metrics
    assert read_summary(output_dir)["eval"] == {"calls": 200.0}


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
        _, iterations, variables = line.split()
        assert int(iterations) == summary["steps"] and int(variables) > 2, line  # applied every step, slots saved

    output_dir = tmp_path / "killed"
    process = start_train("fit", cwd=tmp_path, OUTPUT_DIR=output_dir, stdout=subprocess.DEVNULL,
                          stderr=subprocess.DEVNULL, **settings)  # fmt: skip
    state = output_dir / "checkpoints" / "checkpoint"  # names a checkpoint once its save is complete, not its .index
    wait_for(lambda: state.is_file() and '"ckpt-8"' in state.read_text(), process, f"ckpt-8 named in {state}")
    kill_mid_run(process, output_dir, pattern="checkpoints/ckpt-8.index")
    rerun = run_train("fit", cwd=tmp_path, OUTPUT_DIR=output_dir, **settings)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    resumed = read_summary(output_dir)
    assert 8 <= resumed["resumed_from_step"] < summary["steps"], (resumed["resumed_from_step"], summary["steps"])
    assert resumed["weights_sha256"] == summary["weights_sha256"]
    exported = run_python(["-c", "import sys, keras; m = keras.saving.load_model(sys.argv[1]); print(m.name, "
                           "m.outputs[0].shape)", str(output_dir / "model.keras")])  # fmt: skip
    assert exported.returncode == 0, exported.stderr[-2000:]
    assert exported.stdout.strip().splitlines()[-1] == "generator (None, 32, 32, 3)"  # export_model's model


GUIDE = """
import keras, tensorflow as tf
from examples.custom_step import CustomModel, build_model as guide
"""
BUILD_MINE = """
def build_model(input_shape, num_classes, learning_rate):
    made = guide(input_shape, num_classes, learning_rate)
    model = Mine(made.inputs, made.outputs)
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model
"""


def mine(body: str, base: str = "CustomModel") -> str:
    """A model file whose model is the guide's, its class `body` on `base` (the guide's class: its train_step)."""
    return f"{GUIDE}\nclass Mine({base}):\n{body}\n{BUILD_MINE}"


REFUSED = {
    "overrides_fit": (
        mine("    def fit(self, *args, **kwargs):\n        return super().fit(*args, **kwargs)\n"),
        "Mine overrides fit, which the engine does not call",
    ),
    "never_applies_its_second_optimizer": (
        GUIDE + "def build_model(input_shape, num_classes, learning_rate):\n"
        "    model = guide(input_shape, num_classes, learning_rate)\n"
        "    model.head_optimizer = keras.optimizers.SGD()\n    return model\n",
        "the model's optimizer 'head_optimizer' is still unbuilt after tracing train_step once",
    ),
    "overrides_train_on_batch_alone": (
        mine(
            "    def train_on_batch(self, *args, **kwargs):\n        return super().train_on_batch(*args, **kwargs)\n",
            base="keras.Model",
        ),
        "Mine overrides train_on_batch, which the engine does not call",
    ),
    "returns_a_tensor": (
        mine("    def train_step(self, data):\n        super().train_step(data)\n        return tf.constant(1.0)\n"),
        "train_step returned a tensor: it must return a dict of scalars",
    ),
    "returns_an_empty_dict": (
        mine("    def train_step(self, data):\n        super().train_step(data)\n        return {}\n"),
        "train_step returned an empty dict (nothing to log): it must return a dict of scalars",
    ),
    "step_fails": (
        mine("    def train_step(self, data):\n        raise RuntimeError('not today')\n"),
        "its train_step failed on a batch of the data's spec (inputs and labels as the model gets them): RuntimeError",
    ),
}


def test_what_the_engine_cannot_run_of_a_custom_step_is_one_line_naming_it(tmp_path, tfds_data_dir):
    """All built in one process through the engine's `build`, on 2 replicas (what fit, evaluate and check call)."""
    paths = {name: tmp_path / f"{name}.py" for name in REFUSED}
    for name, (source, _) in REFUSED.items():
        paths[name].write_text(source)
    result = run_python(["-c", BUILD_EACH, *map(str, paths.values())], cwd=tmp_path,
                        env=clean_env(TFDS_DATA_DIR=tfds_data_dir, CPU_DEVICES=2))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    said = json.loads(result.stdout.strip().splitlines()[-1])
    for name, (_, expected) in REFUSED.items():
        message = said[str(paths[name])]
        assert message is not None and expected in message, (name, message)
        assert message.startswith(f"MODEL={str(paths[name])!r}") and "\n" not in message, message


@pytest.mark.parametrize(
    ("settings", "expected"),
    [
        ({"MODEL": str(REPO / "examples" / "gan.py"), "DATASET": "synthetic_images", "MONITOR": "val_d_loss"},
         "error: MONITOR='val_d_loss' names an evaluation metric, but MODEL="),
        ({"MODEL": str(REPO / "examples" / "custom_step.py"), "MIXED_PRECISION": "mixed_float16"},
         "error: MIXED_PRECISION=mixed_float16 is not allowed with MODEL="),
    ],
)  # fmt: skip
def test_a_setting_a_custom_step_cannot_honour_stops_fit_before_the_run_directory(
    settings, expected, tmp_path, tfds_data_dir, examples_data_dir
):
    data_dir = examples_data_dir if settings.get("DATASET") else tfds_data_dir
    result = run_train("fit", cwd=tmp_path, TFDS_DATA_DIR=data_dir, OUTPUT_DIR=tmp_path / "run", **settings)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith(expected), result.stderr[-500:]
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


# `python -m train fit` on a host whose GPUs MIXED_PRECISION=auto would run in float16 (compute capability 7.x, a
# T4): the one answer faked is what this host's GPUs support (train.fit's auto_precision, which reads their compute
# capabilities); the training itself runs on the CPU.
FLOAT16_HOST = """
import runpy, sys
import train.start
train.start.auto_precision = lambda plan: ("mixed_float16", "every GPU has compute capability 7.x+ (faked: a T4)")
sys.argv = ["python -m train", "fit"]
runpy.run_module("train", run_name="__main__")
"""
LOSS_SCALED = """
import sys, tensorflow as tf
print(any("scale" in name for name, _ in tf.train.list_variables(tf.train.latest_checkpoint(sys.argv[1]))))
"""


def test_auto_precision_runs_a_custom_step_in_float32_where_it_would_pick_float16_and_says_so(tmp_path, tfds_data_dir):
    """Issue 32: float16's loss scale would judge each replica's gradients alone in the model's own step, so
    MIXED_PRECISION=auto falls back to float32 where the GPUs would get float16. Fakes the GPUs' answer
    (FLOAT16_HOST): auto resolves to mixed_float16 through the engine's own agreement, as on a T4."""
    output_dir = tmp_path / "run"
    env = clean_env(MODEL=str(REPO / "examples" / "custom_step.py"), TFDS_DATA_DIR=tfds_data_dir,
                    OUTPUT_DIR=output_dir, MIXED_PRECISION="auto", **{**SMALL, "EPOCHS": 1})  # fmt: skip
    result = run_python(["-c", FLOAT16_HOST], cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "MIXED_PRECISION=auto: float32, not mixed_float16, for a model's own train_step" in result.stdout
    assert read_summary(output_dir)["precision"] == "float32"
    assert json.loads((output_dir / "run.json").read_text())["precision"] == "float32"  # a resume keeps float32
    scaled = run_python(["-c", LOSS_SCALED, str(output_dir / "checkpoints")])
    assert scaled.stdout.strip().splitlines()[-1] == "False", scaled.stderr[-2000:]  # no loss scale trained


PREDICATES = """
import keras
from examples.custom_step import build_model
from train.model_file import Experiment
class Below(keras.Model):
    def train_step(self, data):
        return super().train_step(data)
class Above(Below):
    pass
plain = keras.Sequential([keras.Input((2,)), keras.layers.Dense(1)])
inputs = keras.Input((2,))
above = Above(inputs, keras.layers.Dense(1)(inputs))
guide = build_model((4,), 3, 0.1)
own_train, own_test = Experiment.own_train_step, Experiment.own_test_step
print(own_train(guide), own_train(above), own_train(plain), own_test(guide))
"""


def test_overrides_train_step_sees_an_override_in_the_class_or_a_base_below_keras_model():
    """The predicate gradient accumulation (and any other engine-step-only option) asks."""
    result = run_python(["-c", PREDICATES], cwd=HARNESS_CWD)
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == "True True False False"
