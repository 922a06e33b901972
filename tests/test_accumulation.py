"""Gradient accumulation: GLOBAL_BATCH_SIZE with BATCH_SIZE trains the global batch in micro-batches of at most
BATCH_SIZE per replica, one optimizer update a step, and ends where the unaccumulated run does. TensorFlow runs in
processes of their own."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import HARNESS_CWD, REPO, clean_env, kill_mid_run, read_summary, run_python, run_train, start_train
from tests.harness.runs import moved_copy, relative_difference
from train.batches import Batch, batch_plan
from train.errors import SettingsError
from train.model_file import DEFAULT_MODEL
from train.settings import load_settings
from train.step import accumulation_changed, describe_batch


def batch_of(settings) -> Batch:
    """The settings' batch as train.start.batch_of makes it (without importing TensorFlow)."""
    return Batch(settings.global_batch_size, settings.batch_size, settings.batch_from)


# 600 steps of 256 (the measure); no checkpoint or log cuts a call short
# JIT_COMPILE=None: the engine's auto (XLA on one CPU device), whose line the 1-device case asserts
ACCUMULATE = {"GLOBAL_BATCH_SIZE": 256, "STEPS_PER_EPOCH": 200, "EPOCHS": 3, "CHECKPOINT_EVERY": 1000,
              "LOG_EVERY": 1000, "LEARNING_RATE": 0.003, "JIT_COMPILE": None}  # fmt: skip


def plan(global_batch: int | None, batch: int | None, replicas: int) -> tuple[int, int]:
    flags = {"GLOBAL_BATCH_SIZE": str(global_batch or ""), "BATCH_SIZE": str(batch or "")}
    return batch_plan(
        batch_of(load_settings(flags, environ={}, dotenv_path="/nonexistent", defaults_path=None)), replicas
    )


def test_the_micro_batch_is_the_largest_divisor_of_a_replicas_share_within_batch_size():
    assert plan(256, 128, 8) == (32, 1)  # .env.example's BATCH_SIZE=128 on 8 GPUs: 32 a replica, no accumulation
    assert plan(256, 32, 2) == (32, 4)  # resumed on 2 GPUs with BATCH_SIZE=32: 4 micro-batches
    assert plan(96, 40, 1) == (32, 3)  # 40 does not divide 96: the largest divisor under it
    assert plan(256, None, 2) == (128, 1)  # GLOBAL_BATCH_SIZE alone: as before
    assert plan(None, 64, 2) == (64, 1)  # BATCH_SIZE alone: as before
    with pytest.raises(SettingsError, match=r"^GLOBAL_BATCH_SIZE=255 does not divide by the 2 replicas"):
        plan(255, 32, 2)  # with BATCH_SIZE too: the same refusal


def on_gpus(gpus: int, dotenv: Path, **flags: str):
    """The settings (.env as `dotenv`, flags) resolved on `gpus` GPUs, without TensorFlow: (settings, resolution)."""
    from train.devices.runtime import DevicePlan, resolve

    settings = load_settings(flags, environ={}, dotenv_path=dotenv, defaults_path=None)
    plan = DevicePlan(gpus, tuple(range(gpus)), True, None, 1, ())
    return settings, resolve(settings, plan)


def test_the_start_line_names_the_micro_batch_the_accumulation_and_where_each_setting_came_from(tmp_path):
    dotenv = tmp_path / ".env"
    dotenv.write_text((REPO / ".env.example").read_text().replace("GLOBAL_BATCH_SIZE=\n", "GLOBAL_BATCH_SIZE=256\n"))
    settings, eight = on_gpus(8, dotenv)  # .env.example's BATCH_SIZE=128 with GLOBAL_BATCH_SIZE=256 on 8 GPUs
    assert describe_batch(batch_of(settings), eight) == (
        f"global batch 256 = 32 per replica x 8 (GLOBAL_BATCH_SIZE=256 from {dotenv}, BATCH_SIZE=128 from {dotenv}: "
        "32 a replica, no accumulation)"
    )
    settings, two = on_gpus(2, dotenv, BATCH_SIZE="32")  # resumed on 2 GPUs, BATCH_SIZE=32 as a flag
    assert describe_batch(batch_of(settings), two) == (
        f"global batch 256 = micro-batch 32 x 4 accumulated x 2 (GLOBAL_BATCH_SIZE=256 from {dotenv}, BATCH_SIZE=32 "
        "from a flag: 128 a replica, at most 32 at once)"
    )
    assert accumulation_changed({"replicas": 8, "accumulation": 1}, two) == (
        "The global batch stays 256 (GLOBAL_BATCH_SIZE): the last start ran 8 replica(s) accumulating 1, this one 2 "
        "accumulating 4 micro-batch(es) of 32 a step; the data order and EPOCHS are kept."
    )
    settings, alone = on_gpus(2, tmp_path / "none", GLOBAL_BATCH_SIZE="256")
    assert describe_batch(batch_of(settings), alone) == "global batch 256 = 128 per replica x 2"  # as before


@pytest.fixture(scope="module")
def unaccumulated(tmp_path_factory, tfds_data_dir) -> Path:
    """The reference: 600 steps of 256 on one device, each step's batch at once."""
    run = tmp_path_factory.mktemp("unaccumulated") / "run"
    result = run_train("fit", cwd=run.parent, OUTPUT_DIR=run, TFDS_DATA_DIR=tfds_data_dir, BATCH_SIZE=None,
                       **ACCUMULATE)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_summary(run)["accumulation"] == 1
    return run


# The killed run's cadence: a checkpoint to resume from every 40 steps, calls of 4 steps between them
KILLABLE = {"STEPS_PER_CALL": 4, "CHECKPOINT_EVERY": 40}


@pytest.fixture(scope="module")
def accumulated_on_one_device(tmp_path_factory, tfds_data_dir) -> tuple[subprocess.CompletedProcess, Path]:
    """600 steps of 256 on one device as 4 micro-batches of 64, uninterrupted, at the killed run's cadence: the
    1-device case of the comparison with `unaccumulated`, and the reference of the killed run."""
    run = tmp_path_factory.mktemp("accumulated") / "run"
    result = run_train("fit", cwd=run.parent, OUTPUT_DIR=run, TFDS_DATA_DIR=tfds_data_dir, CPU_DEVICES=1,
                       BATCH_SIZE=64, **{**ACCUMULATE, **KILLABLE})  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return result, run


@pytest.mark.parametrize(("devices", "batch"), [(1, 64), (2, 32)], ids=["1 device", "2 replicas"])
def test_accumulating_4_micro_batches_ends_where_the_unaccumulated_run_does(
    tmp_path, tfds_data_dir, unaccumulated, accumulated_on_one_device, devices, batch
):
    if devices == 1:
        result, run = accumulated_on_one_device
    else:
        run = tmp_path / "run"
        result = run_train("fit", cwd=tmp_path, OUTPUT_DIR=run, TFDS_DATA_DIR=tfds_data_dir, CPU_DEVICES=devices,
                           BATCH_SIZE=batch, **ACCUMULATE)  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
    assert (
        f"global batch 256 = micro-batch {batch} x 4 accumulated x {devices} (GLOBAL_BATCH_SIZE=256 from the "
        f"environment, BATCH_SIZE={batch} from the environment: {256 // devices} a replica, at most {batch} at once)"
    ) in result.stdout
    if devices == 1:  # the micro-batches' loop compiles with the rest of a call of STEPS_PER_CALL steps
        assert "XLA on (auto: on for one CPU device, the whole call compiled)" in result.stdout
    summary, reference = read_summary(run), read_summary(unaccumulated)
    assert (summary["accumulation"], summary["per_replica_batch"], summary["global_batch"]) == (4, batch, 256)
    assert summary["steps"] == summary["total_steps"] == 600  # a step is one optimizer update
    assert [start["accumulation"] for start in summary["starts"]] == [4]
    assert relative_difference(unaccumulated, run) < 1e-3
    for name, value in reference["eval"].items():
        assert summary["eval"][name] == pytest.approx(value, abs=2e-3), name
    assert summary["train"]["loss"] == pytest.approx(reference["train"]["loss"], rel=1e-3)


@pytest.mark.slow
def test_two_workers_accumulating_end_where_one_device_unaccumulated_does(tmp_path, tfds_data_dir, unaccumulated):
    from tests.test_multi_worker import run_workers

    # the documented MLP, as `unaccumulated` trains it: BatchNormalization's moments are a micro-batch's
    workers = run_workers(tmp_path, [{}, {}], tfds_data_dir, **{**ACCUMULATE, "BATCH_SIZE": 32, "STEPS_PER_CALL": 8,
                                                              "MODEL": DEFAULT_MODEL})  # fmt: skip
    assert [code for code, _ in workers] == [0, 0], workers[0][1][-3000:]
    summary = read_summary(tmp_path / "run")
    assert (summary["workers"], summary["accumulation"], summary["global_batch"]) == (2, 4, 256)
    assert relative_difference(unaccumulated, tmp_path / "run") < 1e-3


def harness(*args: str) -> dict:
    result = run_python(["-m", "tests.harness.accumulation", *args], cwd=HARNESS_CWD, env=clean_env())
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_clipping_clips_the_accumulated_global_gradient_and_the_metrics_cover_every_micro_batch():
    """12 steps at a global batch of 64: at once on one device, against 4 micro-batches of 16 on one device and
    2 micro-batches of 16 on each of 2 replicas. Clipping each micro-batch's gradient would end elsewhere."""
    options = [{}, {"global_clipnorm": 0.05}, {"clipnorm": 0.05}, {"clipvalue": 0.001}]
    report = harness("same", *(json.dumps(each) for each in options))
    for each, outcome in report.items():
        assert outcome["moved"] > 0.1, each
        for name in ("one_x4", "two_x2"):
            assert outcome[name]["max_difference"] < 1e-5, (each, name, outcome[name]["max_difference"])
            assert outcome[name]["metrics"] == pytest.approx(outcome["metrics"], rel=1e-5), (each, name)
            assert outcome[name]["iterations"] == 12  # one optimizer update a step


def test_a_float16_overflow_in_one_micro_batch_skips_the_whole_step_on_every_replica():
    outcome = harness("overflow")
    assert outcome["accumulation"] == 4
    assert outcome["skipped"] == [1, 0]
    assert outcome["scale"] == [32768.0, 16384.0, 16384.0]  # halved once for the window, not per micro-batch
    assert outcome["unchanged_by_overflow"] and outcome["finite"] and outcome["moved_after_normal_step"]
    assert outcome["counted_after_overflow"] == 0  # the skipped step's micro-batches count in no metric
    assert outcome["counted_after_normal"] == 64  # the next step's every micro-batch does


@pytest.mark.slow
def test_an_accumulating_run_killed_mid_training_resumes_to_the_same_weights(
    tmp_path, tfds_data_dir, accumulated_on_one_device
):
    settings = {**ACCUMULATE, **KILLABLE, "TFDS_DATA_DIR": tfds_data_dir, "CPU_DEVICES": 1, "BATCH_SIZE": 64}
    straight = accumulated_on_one_device[1]  # these settings, uninterrupted
    run = tmp_path / "killed"
    process = start_train("fit", cwd=tmp_path, OUTPUT_DIR=run, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                          **settings)  # fmt: skip
    kill_mid_run(process, run, settle=0.3)
    resumed = run_train("fit", cwd=tmp_path, OUTPUT_DIR=run, **settings)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = read_summary(run)
    assert summary["resumed_from_step"] % 40 == 0 and summary["resumed_from_step"] > 0  # saved between steps only
    assert summary["weights_sha256"] == read_summary(straight)["weights_sha256"]


@pytest.mark.slow
def test_two_replicas_resumed_on_one_accumulating_end_where_the_two_do(tmp_path, tfds_data_dir):
    """8 GPUs x 32 resumed on 2 with BATCH_SIZE=32, in small: 2 replicas x 128 resumed on 1 with BATCH_SIZE=64."""
    # 3 epochs of 40 steps, a checkpoint at each epoch's end: stopped at step 40 is the copy taken back to ckpt-40
    common = {**ACCUMULATE, "TFDS_DATA_DIR": tfds_data_dir, "STEPS_PER_EPOCH": 40, "CHECKPOINT_EVERY": 40,
              "KEEP_CHECKPOINTS": 20}  # fmt: skip
    straight = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "straight", CPU_DEVICES=2, BATCH_SIZE=None,
                         **common)  # fmt: skip
    assert straight.returncode == 0, straight.stderr[-3000:]
    moved_copy(tmp_path / "straight", tmp_path / "moved")
    moved = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "moved", CPU_DEVICES=1, BATCH_SIZE=64, **common)
    assert moved.returncode == 0, moved.stderr[-3000:]
    assert (
        "The global batch stays 256 (GLOBAL_BATCH_SIZE): the last start ran 2 replica(s) accumulating 1, this one 1 "
        "accumulating 4 micro-batch(es) of 64 a step"
    ) in moved.stdout
    assert "the global batch is" not in moved.stdout and "BATCH_SIZE (unset) -> 64" not in moved.stdout
    summary = read_summary(tmp_path / "moved")
    assert [(s["replicas"], s["accumulation"], s["global_batch"]) for s in summary["starts"]] == [
        (2, 1, 256),
        (1, 4, 256),
    ]
    assert summary["steps"] == 120 and summary["accumulation"] == 4
    assert relative_difference(tmp_path / "straight", tmp_path / "moved") < 1e-3


# The fake device runs out of memory where the replicas together take more than LIMIT examples at once (a step's
# global batch / its accumulation): what running out of device memory depends on.
FAKE_OOM = """
import sys, tensorflow as tf
from train.step import TrainCalls
real_call = TrainCalls.__call__
LIMIT = int(sys.argv[1])

def call(self, steps):
    if self.global_batch // self.accumulation > LIMIT:
        raise tf.errors.ResourceExhaustedError(None, None, "OOM when allocating tensor (faked by the test)")
    return real_call(self, steps)

TrainCalls.__call__ = call
from train.cli import app
app(sys.argv[2:], prog_name="train")
"""


def test_auto_batch_keeps_the_global_batch_and_accumulates_more(tmp_path, tfds_data_dir):
    run = tmp_path / "run"
    env = clean_env(TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=run, GLOBAL_BATCH_SIZE=192, BATCH_SIZE=None, EPOCHS=1,
                    AUTO_BATCH="true", CPU_DEVICES=2)  # fmt: skip
    result = run_python(["-c", FAKE_OOM, "40", "fit"], cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    said = [line for line in result.stdout.splitlines() if line.startswith("AUTO_BATCH:")]
    # a replica's share is 96: 96 -> 48 -> 32 -> 24 -> 16 at once (2 replicas: 32 <= 40), the divisors of 96
    assert [line.split("out of memory at BATCH_SIZE=")[1].split()[0] for line in said] == ["96", "48", "32", "24"]
    assert "with micro-batches of 16 per replica, 6 accumulated a step (global batch 192 and the data order" in said[-1]
    summary = read_summary(run)
    assert (summary["per_replica_batch"], summary["accumulation"], summary["global_batch"]) == (16, 6, 192)
    assert summary["steps"] == summary["total_steps"] == 16384 // 192
    assert summary["starts"][-1]["accumulation"] == 6


ACCUMULATING_MODEL = """
import keras

class Custom(keras.Sequential):
    def train_step(self, data):
        return super().train_step(data)

def build_model(input_shape, num_classes, learning_rate):
    model = Custom([keras.Input(input_shape), keras.layers.Dense(num_classes, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss="sparse_categorical_crossentropy")
    return model
"""


def test_accumulation_with_a_custom_train_step_is_refused_before_anything_is_written(tmp_path, tfds_data_dir):
    (tmp_path / "custom.py").write_text(ACCUMULATING_MODEL)
    result = run_train("fit", cwd=tmp_path, MODEL="custom.py", TFDS_DATA_DIR=tfds_data_dir, GLOBAL_BATCH_SIZE=256,
                       BATCH_SIZE=64, OUTPUT_DIR=tmp_path / "run")  # fmt: skip
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: MODEL='custom.py' overrides train_step, and GLOBAL_BATCH_SIZE with BATCH_SIZE asks")
    assert "accumulate 4 micro-batches" in last and "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()
