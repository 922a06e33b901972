"""The fork's experiment, end to end in real processes: build_model's hyperparameters and the run's facts
(`context`, its `sample`), Keras callbacks called as `model.fit` calls them and replayed on a restart, and the best
epoch by MONITOR kept and exported."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import REPO, clean_env, read_summary, run_python, run_train, start_python, tensorboard_events
from train.cluster.launch import free_ports, tf_configs

# Writes the context build_model got, the hyperparameters' values and a digest of context.sample beside the run
# directory, one file a process. FACTS_PREPROCESS=1 gives it a preprocess (the general path); FACTS_CALLBACKS=1 an
# EarlyStopping that stops after epoch 2 (min_delta=10: no epoch after the first is better).
FACTS = '''import hashlib, json, os, time
import numpy as np
import keras
import tensorflow as tf
import tensorflow_datasets as tfds
import train.datasets.synthetic

SAMPLE = 300
if os.environ.get("FACTS_PREPROCESS"):
    def preprocess(example, training, seed):
        return example["features"] * 2.0, example["label"]
if os.environ.get("FACTS_CALLBACKS"):
    def build_callbacks(context):
        return [keras.callbacks.EarlyStopping(monitor="val_loss", min_delta=10, patience=1)]


def first_examples(n, labels=False):
    """The first n examples of the train split as TFDS lists them (their labels), read here apart from the engine."""
    builder = tfds.builder("synthetic_clusters", data_dir=os.environ["TFDS_DATA_DIR"])
    read = tfds.ReadConfig(interleave_cycle_length=1)
    examples = list(builder.as_dataset(split="train", shuffle_files=False, read_config=read).take(n))
    if labels:
        return np.stack([e["label"].numpy() for e in examples])
    return np.stack([e["features"].numpy() for e in examples]) * (2.0 if os.environ.get("FACTS_PREPROCESS") else 1.0)


def build_model(input_shape, num_classes, learning_rate, *, width=16, dropout=0.0, context):
    batches = [batch.numpy() for batch in context.sample(SAMPLE)]
    sample = np.concatenate(batches)
    names = ("global_batch", "replicas", "workers", "steps_per_epoch", "epochs", "total_steps", "seed", "precision",
             "is_chief")
    facts = {name: getattr(context, name) for name in names}
    facts.update(width=width, dropout=dropout, batches=[len(b) for b in batches], sample=list(sample.shape),
                 sample_sha256=hashlib.sha256(sample.tobytes()).hexdigest(),
                 sample_is_the_first_examples=bool(np.array_equal(sample, first_examples(SAMPLE))))
    pairs = [(inputs.numpy(), labels.numpy()) for inputs, labels in context.sample(SAMPLE, labels=True)]
    facts["labeled_sample_is_the_first_examples"] = bool(
        np.array_equal(np.concatenate([inputs for inputs, _ in pairs]), sample)
        and np.array_equal(np.concatenate([labels for _, labels in pairs]), first_examples(SAMPLE, labels=True)))
    try:
        context.global_batch = 1
    except Exception as error:
        facts["frozen"] = type(error).__name__
    (context.output_dir.parent / f"facts-{os.getpid()}-{time.monotonic_ns()}.json").write_text(json.dumps(facts))
    model = keras.Sequential([keras.Input(input_shape), keras.layers.Dense(width, activation="relu"),
                              keras.layers.Dropout(dropout), keras.layers.Dense(num_classes, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model
'''

# A callback that notes every hook it is called with; STOP_AT_STEP sets model.stop_training after that step.
RECORDER = """import json, os
from pathlib import Path
import keras


class Recorder(keras.callbacks.Callback):
    def __init__(self, path):
        super().__init__()
        self.path, self.events = Path(path), []

    def on_train_begin(self, logs=None):
        self.events += [["model", self.model.name], ["train_begin", logs]]

    def on_epoch_begin(self, epoch, logs=None):
        self.events.append(["epoch_begin", epoch, logs])

    def on_train_batch_begin(self, batch, logs=None):
        self.events.append(["batch_begin", batch])

    def on_train_batch_end(self, batch, logs=None):
        self.events.append(["batch_end", batch, sorted(logs), all(type(v) is float for v in logs.values())])
        step = self.epoch * self.params["steps"] + batch + 1
        if step == int(os.environ.get("STOP_AT_STEP", 0)):
            self.model.stop_training = True

    def on_epoch_end(self, epoch, logs=None):
        self.events.append(["epoch_end", epoch, dict(logs)])
        self.path.write_text(json.dumps(self.events))

    def on_train_end(self, logs=None):
        self.events.append(["train_end", sorted(logs)])
        self.path.write_text(json.dumps(self.events))

    @property
    def epoch(self):
        return [e for e in self.events if e[0] == "epoch_begin"][-1][1]


def build_model(input_shape, num_classes, learning_rate):
    model = keras.Sequential([keras.Input(input_shape), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(num_classes, activation="softmax")], name="forks_own")
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def build_callbacks(context):
    return [Recorder(context.output_dir.parent / ("events.json" if context.is_chief else "worker-events.json"))]
"""

# The same callback under Keras's own model.fit: the events to compare with.
KERAS_FIT = """
import importlib.util, json, sys
import numpy as np
spec = importlib.util.spec_from_file_location("recorder", sys.argv[1])
module = importlib.util.module_from_spec(spec)
spec.loader.exec_module(module)
model = module.build_model((32,), 10, 0.001)
model.compile(optimizer="adam", loss="sparse_categorical_crossentropy", metrics=["accuracy"], steps_per_execution=3)
rng = np.random.default_rng(0)
x, y = rng.normal(size=(192, 32)).astype("float32"), rng.integers(0, 10, 192)
model.fit(x, y, batch_size=32, epochs=2, validation_data=(x[:64], y[:64]), callbacks=[module.Recorder(sys.argv[2])],
          verbose=0)
"""

# EarlyStopping and ReduceLROnPlateau whose decisions need what earlier epochs taught them: min_delta=10 makes
# every epoch after the first they weigh "no better". Early stopping weighs epochs from the third on, so it stops
# after epoch 4; the learning rate halves after every epoch from the second on. SIGTERM_AT_STEP: a SIGTERM then.
STOPPER = """import os, signal
import keras


class Terminate(keras.callbacks.Callback):
    def on_epoch_begin(self, epoch, logs=None):
        self.epoch = epoch

    def on_train_batch_end(self, batch, logs=None):
        if self.epoch * self.params["steps"] + batch + 1 == int(os.environ.get("SIGTERM_AT_STEP", 0)):
            os.kill(os.getpid(), signal.SIGTERM)


def build_model(input_shape, num_classes, learning_rate):
    model = keras.Sequential([keras.Input(input_shape), keras.layers.Dense(16, activation="relu"),
                              keras.layers.Dense(num_classes, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model


def build_callbacks(context):
    return [
        keras.callbacks.EarlyStopping(monitor="val_loss", min_delta=10, patience=1, start_from_epoch=2),
        keras.callbacks.ReduceLROnPlateau(monitor="val_loss", min_delta=10, patience=1, factor=0.5),
        Terminate(),
    ]
"""

SMALL = {"BATCH_SIZE": 32, "STEPS_PER_EPOCH": 10, "STEPS_PER_CALL": 5, "LOG_EVERY": 1000, "EVAL_SPLIT": "test[:512]"}


def fit(tmp_path: Path, data_dir: Path, *args: str, expect: int = 0, **settings: object) -> subprocess.CompletedProcess:
    result = run_train("fit", *args, cwd=tmp_path, TFDS_DATA_DIR=data_dir, OUTPUT_DIR=tmp_path / "run", **settings)
    assert result.returncode == expect, result.stdout[-2000:] + result.stderr[-3000:]
    return result


def facts(folder: Path) -> list[dict]:
    """The facts each build_model wrote, oldest first."""
    found = sorted(folder.glob("facts-*.json"), key=lambda path: int(path.stem.rsplit("-", 1)[1]))
    return [json.loads(path.read_text()) for path in found]


def write(tmp_path: Path, name: str, source: str) -> Path:
    tmp_path.mkdir(parents=True, exist_ok=True)
    (tmp_path / name).write_text(source)
    return tmp_path / name


# --- hyperparameters and the run's facts ---------------------------------------------------------------------


@pytest.fixture(scope="module")
def one_replica(tmp_path_factory, tfds_data_dir):
    """The facts model trained 1 epoch, then resumed to 2 with HP_DROPOUT changed: (folder, results)."""
    folder = tmp_path_factory.mktemp("one_replica")
    model = write(folder, "facts.py", FACTS)
    fit(folder, tfds_data_dir, "--hp-width", "24", MODEL=model, EPOCHS=1, HP_DROPOUT=0.1, **SMALL)
    hparams = tensorboard_events(folder / "run" / "logs")["hparams"]  # the first start's session
    again = fit(folder, tfds_data_dir, "--hp-width", "24", MODEL=model, EPOCHS=2, HP_DROPOUT=0.2, **SMALL)
    return folder, (hparams, again)


def test_hyperparameters_reach_build_model_settings_json_and_the_hparams_table(one_replica):
    folder, (hparams, again) = one_replica
    first, resumed = facts(folder)
    assert (first["width"], first["dropout"], resumed["width"], resumed["dropout"]) == (24, 0.1, 24, 0.2)
    recorded = json.loads((folder / "run" / "settings.json").read_text())
    assert (recorded["HP_WIDTH"], recorded["HP_DROPOUT"]) == ("24", "0.2")
    assert "warning: resuming with settings changed since this run directory's last start: HP_DROPOUT 0.1 -> 0.2" in (
        again.stdout
    )
    assert (hparams["HP_WIDTH"], hparams["HP_DROPOUT"]) == (24, pytest.approx(0.1))


def test_context_gives_the_runs_facts_frozen_and_the_same_sample_on_every_start(one_replica):
    folder, _ = one_replica
    first, resumed = facts(folder)
    assert first == first | {
        "global_batch": 32, "replicas": 1, "workers": 1, "steps_per_epoch": 10, "epochs": 1, "total_steps": 10,
        "seed": 42, "precision": "float32", "is_chief": True, "frozen": "FrozenInstanceError",
        "sample": [300, 32], "batches": [256, 44], "sample_is_the_first_examples": True,
        "labeled_sample_is_the_first_examples": True,
    }  # fmt: skip
    assert (resumed["epochs"], resumed["total_steps"]) == (2, 20)
    assert resumed["sample_sha256"] == first["sample_sha256"]  # a restart adapts on the same examples


def test_context_on_two_replicas_and_sample_after_preprocess_streamed(tmp_path, tfds_data_dir, one_replica):
    model = write(tmp_path, "facts.py", FACTS)
    fit(tmp_path, tfds_data_dir, MODEL=model, EPOCHS=1, CPU_DEVICES=2, DATA_IN_MEMORY="false", FACTS_PREPROCESS=1,
        **SMALL | {"BATCH_SIZE": 16})  # fmt: skip
    (two,) = facts(tmp_path)
    assert (two["global_batch"], two["replicas"], two["workers"], two["total_steps"]) == (32, 2, 1, 10)
    assert two["sample_is_the_first_examples"]  # preprocess(training=False) of the first examples, in order
    assert two["labeled_sample_is_the_first_examples"]  # sample(n, labels=True): the same, their labels beside them
    assert two["sample_sha256"] != facts(one_replica[0])[0]["sample_sha256"]  # doubled by this preprocess


def start_workers(tmp_path: Path, data_dir: Path, per_worker: list[dict], **settings: object) -> list:
    """`python -m train fit` on 2 workers on 127.0.0.1, each with its own settings; output to files."""
    processes = []
    for index, (config, own) in enumerate(zip(tf_configs(free_ports(len(per_worker))), per_worker, strict=True)):
        env = clean_env(**{**settings, **own}, STRATEGY="multi_worker", TF_CONFIG=config, TFDS_DATA_DIR=data_dir,
                        OUTPUT_DIR=tmp_path / "run", WORKER_START_TIMEOUT=60)  # fmt: skip
        with open(tmp_path / f"worker{index}.log", "wb") as stream:
            processes.append(start_python(["-m", "train", "fit"], cwd=tmp_path, env=env, stdout=stream,
                                          stderr=subprocess.STDOUT))  # fmt: skip
    try:
        codes = [process.wait(timeout=120) for process in processes]
    finally:
        for process in processes:
            process.kill()
    return codes


@pytest.mark.slow
def test_context_on_two_workers_the_same_sample_on_each_and_callbacks_and_monitor_alike(
    tmp_path, tfds_data_dir, one_replica
):
    """Both workers run the callbacks; the chief's stop_training ends both after epoch 2; both evaluate the best
    epoch (MONITOR=val_loss, max: the first), restored from the chief's checkpoints."""
    model = write(tmp_path, "facts.py", FACTS)
    codes = start_workers(tmp_path, tfds_data_dir, [{}, {}], MODEL=model, EPOCHS=3, FACTS_CALLBACKS=1,
                          MONITOR="val_loss", MONITOR_MODE="max", **SMALL | {"BATCH_SIZE": 16})  # fmt: skip
    assert codes == [0, 0], (tmp_path / "worker0.log").read_text()[-3000:]
    workers = facts(tmp_path)
    assert sorted(w["is_chief"] for w in workers) == [False, True]
    for each in workers:
        assert (each["global_batch"], each["replicas"], each["workers"], each["steps_per_epoch"]) == (32, 2, 2, 10)
        assert each["sample_sha256"] == facts(one_replica[0])[0]["sample_sha256"]  # the one host's, too
    summary = read_summary(tmp_path / "run")
    assert (summary["stopped_early"], summary["steps"], summary["best"]["epoch"]) == (True, 20, 1)
    assert summary["eval"]["loss"] == summary["best"]["val_loss"]


def test_workers_must_agree_on_a_hyperparameter(tmp_path, tfds_data_dir):
    model = write(tmp_path, "facts.py", FACTS)
    codes = start_workers(tmp_path, tfds_data_dir, [{"HP_DROPOUT": 0.1}, {"HP_DROPOUT": 0.2}], MODEL=model, **SMALL)
    assert codes == [2, 2]
    for index in (0, 1):
        last = (tmp_path / f"worker{index}.log").read_text().strip().splitlines()[-1]
        assert last.startswith("error: worker 1 does not match the chief: HP_DROPOUT='0.2' on worker 1 but '0.1'")
    assert not list((tmp_path / "run").glob("checkpoints/*"))


# --- callbacks -------------------------------------------------------------------------------------------------


def test_callbacks_get_the_hooks_and_logs_model_fit_gives_them(tmp_path, tfds_data_dir):
    model = write(tmp_path, "recorder.py", RECORDER)
    fit(tmp_path, tfds_data_dir, MODEL=model, EPOCHS=2, MONITOR="val_accuracy", **SMALL | {"STEPS_PER_EPOCH": 6,
        "STEPS_PER_CALL": 3})  # fmt: skip
    ours = json.loads((tmp_path / "events.json").read_text())
    keras_fit = run_python(["-c", KERAS_FIT, str(model), str(tmp_path / "keras.json")], cwd=tmp_path)
    assert keras_fit.returncode == 0, keras_fit.stderr[-3000:]
    theirs = json.loads((tmp_path / "keras.json").read_text())

    def shape(events):  # what is called, in which order, with which indices and names (not the values)
        return [[*e[:2], sorted(e[2])] if e[0] == "epoch_end" else e for e in events]

    assert shape(ours) == shape(theirs)
    assert ours[0] == ["model", "forks_own"]  # callback.model is the fork's model, not the engine's wrapper
    assert [e[1] for e in ours if e[0] == "batch_end"] == [2, 5, 2, 5]  # the epoch's index of each call's last step
    summary, logs = read_summary(tmp_path / "run"), [e[2] for e in ours if e[0] == "epoch_end"]
    assert set(logs[-1]) == {"loss", "accuracy", "val_loss", "val_accuracy"}
    assert json.loads((tmp_path / "run" / "epochs.json").read_text())[1]["logs"] == logs[1]
    best = max(range(2), key=lambda epoch: logs[epoch]["val_accuracy"])  # MONITOR=val_accuracy: auto is max
    assert summary["best"] == {"epoch": best + 1, "step": 6 * (best + 1), "val_accuracy": logs[best]["val_accuracy"]}
    assert summary["eval"]["accuracy"] == logs[best]["val_accuracy"]
    assert summary["stopped_early"] is False


def test_a_callback_that_sets_stop_training_ends_the_run_with_a_checkpoint_and_the_export(tmp_path, tfds_data_dir):
    model = write(tmp_path, "recorder.py", RECORDER)
    result = fit(tmp_path, tfds_data_dir, MODEL=model, EPOCHS=3, STOP_AT_STEP=15, **SMALL)
    summary = read_summary(tmp_path / "run")
    assert (summary["stopped_early"], summary["interrupted"], summary["steps"]) == (True, False, 15)
    assert summary["checkpoint"].endswith("ckpt-15") and (tmp_path / "run" / "model.keras").is_file()
    assert "Stopped early at step 15 (epoch 2): a callback set model.stop_training." in result.stdout
    events = json.loads((tmp_path / "events.json").read_text())
    assert events[-1][0] == "train_end" and [e[1] for e in events if e[0] == "epoch_end"] == [0]


@pytest.fixture(scope="module")
def uninterrupted_stopper(tmp_path_factory, tfds_data_dir):
    folder = tmp_path_factory.mktemp("uninterrupted_stopper")
    fit(folder, tfds_data_dir, MODEL=write(folder, "stopper.py", STOPPER), EPOCHS=6, LEARNING_RATE=0.01, **SMALL)
    return folder / "run"


def test_early_stopping_and_lr_cuts_decide_alike_across_a_sigterm_and_resume(tmp_path, tfds_data_dir,
                                                                             uninterrupted_stopper):  # fmt: skip
    reference = read_summary(uninterrupted_stopper)
    assert (reference["stopped_early"], reference["steps"]) == (True, 40)  # after epoch 4 of 6

    model = write(tmp_path, "stopper.py", STOPPER)
    settings = {"MODEL": model, "EPOCHS": 6, "LEARNING_RATE": 0.01, **SMALL}
    fit(tmp_path, tfds_data_dir, expect=42, SIGTERM_AT_STEP=35, **settings)  # mid epoch 4: 3 epochs recorded
    assert read_summary(tmp_path / "run")["steps"] == 35
    fit(tmp_path, tfds_data_dir, **settings)
    resumed = read_summary(tmp_path / "run")
    assert (resumed["resumed_from_step"], resumed["stopped_early"], resumed["steps"]) == (35, True, 40)
    assert resumed["weights_sha256"] == reference["weights_sha256"]  # the learning rate was cut alike, not twice

    def decisions(run):  # each epoch's evaluation and learning rate (epoch 4's training metrics cover its resumed
        epochs = json.loads((run / "epochs.json").read_text())  # part only)
        return [(e["epoch"], e["logs"]["val_loss"], e["logs"]["learning_rate"]) for e in epochs]

    assert decisions(tmp_path / "run") == decisions(uninterrupted_stopper)
    # ReduceLROnPlateau logs the rate an epoch trained with, then halves it for the next
    assert [rate for _, _, rate in decisions(tmp_path / "run")] == pytest.approx([0.01, 0.01, 0.005, 0.0025])


# --- MONITOR ---------------------------------------------------------------------------------------------------


def test_monitor_exports_the_best_epoch_and_keeps_its_checkpoint_across_a_resume(tmp_path, tfds_data_dir):
    """MONITOR=val_loss with MONITOR_MODE=max: the highest loss, the first epoch's, is "best", whatever comes
    after; KEEP_CHECKPOINTS=1 would have deleted it. The model: examples/early_stopping.py."""
    settings = {"MONITOR": "val_loss", "MONITOR_MODE": "max", "KEEP_CHECKPOINTS": 1, "CHECKPOINT_EVERY": 5, **SMALL}
    settings["MODEL"] = REPO / "examples" / "early_stopping.py"
    fit(tmp_path, tfds_data_dir, EPOCHS=3, **settings)
    first = read_summary(tmp_path / "run")
    value = first["best"]["val_loss"]
    assert first["best"] == {"epoch": 1, "step": 10, "val_loss": value}
    assert first["eval"]["loss"] == value  # evaluated (and exported) with the best epoch's weights
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("*.index")) == [
        "ckpt-10.index", "ckpt-30.index"]  # fmt: skip

    result = fit(tmp_path, tfds_data_dir, EPOCHS=4, **settings)  # resumed: the best is still epoch 1
    summary = read_summary(tmp_path / "run")
    assert (summary["resumed_from_step"], summary["best"]) == (30, first["best"])
    assert sorted(p.name for p in (tmp_path / "run" / "checkpoints").glob("*.index")) == [
        "ckpt-10.index", "ckpt-40.index"]  # fmt: skip
    assert "MONITOR=val_loss: the best epoch is 1 (step 10, val_loss" in result.stdout
    exported = run_train("evaluate", "--exported", "--output-dir", str(tmp_path / "run"), cwd=tmp_path, MODEL=None)
    assert exported.returncode == 0, exported.stderr[-3000:]
    assert json.loads(exported.stdout[exported.stdout.index("{") :])["loss"] == value  # exactly what was recorded


def test_a_monitor_no_epoch_logs_is_refused_at_the_first_epochs_end_listing_the_names(tmp_path, tfds_data_dir):
    result = fit(tmp_path, tfds_data_dir, expect=2, EPOCHS=2, MONITOR="val_acc", **SMALL)
    assert result.stderr.strip().splitlines()[-1] == (
        "error: MONITOR='val_acc' is not among epoch 1's logs: accuracy, loss, val_accuracy, val_loss; set MONITOR to "
        "one of them (a val_ name is evaluation's), then run again to resume"
    )
    assert "Traceback" not in result.stderr and not (tmp_path / "run" / "summary.json").exists()


def test_bad_callbacks_are_one_line_and_exit_2_before_the_run_directory(tmp_path, tfds_data_dir):
    model = write(tmp_path, "bad.py", RECORDER.replace("return [Recorder(", "return [print, Recorder("))
    result = fit(tmp_path, tfds_data_dir, expect=2, MODEL=model, **SMALL)
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: MODEL={str(model)!r}: build_callbacks returned a list holding builtin_function_or_method: return a "
        "list of keras.callbacks.Callback (see examples/early_stopping.py)"
    )
    assert not (tmp_path / "run").exists()


# --- the fork's own hooks (build_hooks: docs/fork.md, Hooks) ----------------------------------------------------

# A hook (train.hooks) and a Keras callback noting, in one list, every moment they are called at and what they get;
# the list is written at the hook's run_end, one file a start (named by the step it began at).
HOOKED = """import json
from pathlib import Path
import keras
from examples.mlp import build_model
from train.hooks import CallResult, Hook, RunInfo

EVENTS = []


class Noted(Hook):
    def __init__(self, folder):
        self.folder = folder

    def run_begin(self, run):
        self.first = run.step
        EVENTS.append(["run_begin", isinstance(run, RunInfo), str(run.output_dir), run.settings["EPOCHS"], run.step,
                       run.resumed, run.data, run.recorded.get("noted"), run.hyperparameters["replicas"],
                       run.direction("val_accuracy"), run.direction("val_loss")])
        return {"noted": f"begun at {run.step}"}

    def should_stop(self, step, saved_step, skipped):
        EVENTS.append(["should_stop", step, saved_step, skipped])
        return False

    def before_call(self, step):
        EVENTS.append(["before_call", step])

    def after_call(self, step, result, skipped, examples_per_sec):
        EVENTS.append(["after_call", step, isinstance(result, CallResult), sorted(result.metrics),
                       all(type(v) is float for v in result.metrics.values()), skipped])

    def log(self, step, result, examples_per_sec):
        EVENTS.append(["log", step, sorted(result.metrics)])

    def epoch_end(self, epoch, step, metrics):
        EVENTS.append(["epoch_end", epoch, step, sorted(metrics)])

    def save(self, step, skipped):
        EVENTS.append(["save", step])

    def close(self):
        EVENTS.append(["close"])

    def summary(self):
        EVENTS.append(["summary"])
        return {"noted_moments": len(EVENTS)}

    def run_end(self, summary):
        EVENTS.append(["run_end", summary["steps"], summary["noted_moments"]])
        (self.folder / f"hooked-{self.first}.json").write_text(json.dumps(EVENTS))


class Batches(keras.callbacks.Callback):
    def on_train_begin(self, logs=None):
        EVENTS.append(["on_train_begin"])

    def on_train_batch_begin(self, batch, logs=None):
        EVENTS.append(["on_train_batch_begin", batch])

    def on_train_batch_end(self, batch, logs=None):
        EVENTS.append(["on_train_batch_end", batch])

    def on_epoch_end(self, epoch, logs=None):
        EVENTS.append(["on_epoch_end", epoch])


def build_callbacks(context):
    return [Batches()]


def build_hooks(context):
    return [Noted(context.output_dir.parent)]
"""


def noted_call(step: int, end: list) -> list:
    """What Noted and Batches note of one call of 2 steps from `step` (4 steps an epoch), then `end`."""
    return [
        ["should_stop", step, step - step % 4, 0],  # saved at each epoch's end
        ["on_train_batch_begin", step % 4],  # the callbacks are outside the hook: they hear a call's start first
        ["before_call", step],
        ["after_call", step + 2, True, ["accuracy", "loss"], True, 0],
        ["on_train_batch_end", (step + 1) % 4],  # ... and its end after it
        *end,
    ]


def noted_epoch_end(epoch: int, step: int) -> list:
    metrics = ["accuracy", "loss"]
    return [["log", step, metrics], ["epoch_end", epoch, step, metrics], ["on_epoch_end", epoch - 1], ["save", step]]


def test_a_hook_from_the_model_file_is_called_in_order_with_the_runs_typed_values(tmp_path, tfds_data_dir):
    """MODEL's build_hooks: its hooks hear the run's moments where the engine's hooks do (inside the callbacks: a
    call's start after them, its end and an epoch's end before them), with RunInfo and CallResult; what run_begin
    and summary return goes into run.json and summary.json; a resume tells them it resumed, at which step."""
    model = write(tmp_path, "hooked.py", HOOKED)
    settings = {"MODEL": model, "STEPS_PER_EPOCH": 4, "STEPS_PER_CALL": 2, "LOG_EVERY": 1000, "CHECKPOINT_EVERY": 1000}
    settings |= {"EVAL_SPLIT": "test[:256]", "BATCH_SIZE": 32}
    fit(tmp_path, tfds_data_dir, EPOCHS=2, **settings)
    run = tmp_path / "run"
    recorded, summary = json.loads((run / "run.json").read_text()), read_summary(run)
    events = json.loads((tmp_path / "hooked-0.json").read_text())
    assert events == [
        ["run_begin", True, str(run), "2", 0, False, recorded["data"], None, 1, "max", "min"],
        ["on_train_begin"],
        *noted_call(0, []),
        *noted_call(2, noted_epoch_end(1, 4)),
        *noted_call(4, []),
        *noted_call(6, noted_epoch_end(2, 8)),
        ["close"],
        ["summary"],
        ["run_end", 8, len(events) - 1],
    ]
    assert recorded["noted"] == "begun at 0" and summary["noted_moments"] == len(events) - 1

    fit(tmp_path, tfds_data_dir, EPOCHS=3, **settings)
    resumed = json.loads((tmp_path / "hooked-8.json").read_text())
    assert resumed[0][:6] == ["run_begin", True, str(run), "3", 8, True] and resumed[0][7] == "begun at 0"
    assert json.loads((run / "run.json").read_text())["noted"] == "begun at 8"
