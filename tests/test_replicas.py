"""N replicas mean what one means: optimizer options, metrics and float16 loss scaling, on 2 logical CPUs and
on 2 workers on 127.0.0.1, each in fresh processes (tests/harness/replicas.py runs the engine's own build,
feed and training calls)."""

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
    same_weights,
    start_python,
    start_train,
)
from train.cluster.launch import free_ports, tf_configs

SCHEDULE = {"module": "keras.optimizers.schedules", "class_name": "ExponentialDecay",
            "config": {"initial_learning_rate": 0.05, "decay_steps": 4, "decay_rate": 0.5}}  # fmt: skip
OPTIONS = [
    {},
    {"clipnorm": 0.05},  # Keras clips each replica's gradients before summing them: 2.7e-1 apart, measured
    {"global_clipnorm": 0.05},
    {"clipvalue": 0.001},
    {"class_name": "AdamW", "weight_decay": 0.1},
    {"learning_rate": SCHEDULE},
    {"use_ema": True},
]


def harness(*args: str, **env: str) -> dict:
    result = run_python(["-m", "tests.harness.replicas", *args], cwd=HARNESS_CWD, env=clean_env(**env))
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def test_optimizer_options_and_metrics_mean_on_two_replicas_what_they_mean_on_one():
    """12 steps at a global batch of 64: 1 replica of 64 against 2 of 32, the same model and data."""
    report = harness("same", *(json.dumps(options) for options in OPTIONS))
    for options, outcome in report.items():
        assert outcome["moved"] > 0.1, options  # the weights did train
        assert outcome["max_difference"] < 1e-4, (options, outcome["max_difference"])
        assert outcome["metrics_two"] == pytest.approx(outcome["metrics_one"], rel=1e-5), options
        assert set(outcome["metrics_one"]) == {"loss", "accuracy", "top3"}  # every compiled metric, by its name


def test_an_overflow_on_one_replica_is_skipped_by_every_replica_and_halves_the_scale_once():
    """mixed_float16 on 2 logical CPUs; replica 1's input x1000 for one step (Keras judged replica 0 alone)."""
    outcome = harness("overflow")
    assert outcome["replicas"] == 2
    assert outcome["skipped"] == [1, 0]  # the overflowed step skipped, the next one applied
    assert outcome["scale"] == [32768.0, 16384.0, 16384.0]
    assert outcome["unchanged_by_overflow"] and outcome["finite"] and outcome["replica_copies_equal"]
    assert outcome["moved_after_normal_step"]


def test_an_overflow_on_one_worker_is_skipped_by_every_worker():
    processes = [
        start_python(
            ["-m", "tests.harness.replicas", "overflow"],
            cwd=HARNESS_CWD,
            env=clean_env(TF_CONFIG=config, WORKER_START_TIMEOUT=60),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for config in tf_configs(free_ports(2))
    ]
    try:
        outputs = [p.communicate(timeout=180) for p in processes]
    finally:
        for p in processes:
            p.kill()
    assert [p.returncode for p in processes] == [0, 0], [err[-2000:] for _, err in outputs]
    chief, other = (json.loads(out.strip().splitlines()[-1]) for out, _ in outputs)
    assert (chief["worker"], other["worker"]) == (0, 1) and chief["replicas"] == 2
    for outcome in (chief, other):
        assert outcome["skipped"] == [1, 0] and outcome["scale"] == [32768.0, 16384.0, 16384.0]
        assert outcome["unchanged_by_overflow"] and outcome["finite"]
    assert chief["weights_sha"] == other["weights_sha"]


def test_replicas_draw_their_own_random_numbers_and_the_same_ones_again_from_the_same_seed():
    """Augmentation and dropout under MirroredStrategy: without their own streams every replica would flip,
    shift and drop alike (their state is mirrored)."""
    first, again = harness("random"), harness("random")
    assert first["seed_states"] >= 3  # RandomFlip, RandomTranslation and Dropout each keep one
    assert not first["replicas_draw_alike"]
    assert first["inference_alike"]  # nothing random where training=False
    assert first["first_draw"] == again["first_draw"]  # reproducible from SEED


AVERAGES = """
import json, sys
import numpy as np, keras
from pathlib import Path
from train.checkpoints import make_checkpoint
from train.rundir import restore_newest
from train.data import load_data
from train.devices.runtime import setup_runtime
from train.model import build
from train.exportable import use_averaged_weights
from train.model_file import load_model_file
from train.settings import load_settings
settings = load_settings(from_run=True)
runtime, data = setup_runtime(settings), load_data(settings, load_model_file(settings.model))
built = build(settings, load_model_file(settings.model), data.spec, runtime.strategy)
restore_newest(make_checkpoint(built), settings.output_dir / "checkpoints", print)
raw = [w.numpy() for w in built.network.trainable_weights]
use_averaged_weights(built)
averaged = [w.numpy() for w in built.network.trainable_weights]
exported = keras.saving.load_model(settings.output_dir / "model.keras").get_layer(built.network.name).trainable_weights
print(json.dumps({"exported_is_average": all(np.array_equal(a, e.numpy()) for a, e in zip(averaged, exported)),
                  "average_is_not_raw": not all(np.array_equal(a, r) for a, r in zip(averaged, raw))}))
"""


@pytest.mark.slow
def test_optimizer_options_resume_exactly_and_the_moving_averages_are_what_is_evaluated_and_exported(
    tmp_path, tfds_data_dir
):
    """One run with several options at once (AdamW, global clipping, a schedule, EMA): SIGKILLed and resumed, it
    ends where an uninterrupted one does; its averaged weights are what fit evaluated, evaluate scores and the
    export holds."""
    options = {"class_name": "AdamW", "weight_decay": 0.01, "global_clipnorm": 1.0, "use_ema": True,
               "learning_rate": SCHEDULE}  # fmt: skip
    common = {"MODEL": REPO / "tests" / "harness" / "options_model.py", "TEST_OPTIMIZER": json.dumps(options),
              "TFDS_DATA_DIR": tfds_data_dir, "BATCH_SIZE": 16, "EPOCHS": 1, "STEPS_PER_EPOCH": 600,
              "STEPS_PER_CALL": 4, "CHECKPOINT_EVERY": 40, "LOG_EVERY": 1000}  # fmt: skip
    straight = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "straight", **common)
    assert straight.returncode == 0, straight.stderr[-3000:]

    killed = start_train("fit", cwd=tmp_path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
                         OUTPUT_DIR=tmp_path / "resumed", **common)  # fmt: skip
    kill_mid_run(killed, tmp_path / "resumed")
    resumed = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "resumed", **common)
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert read_summary(tmp_path / "resumed")["resumed_from_step"] > 0
    assert same_weights(tmp_path / "resumed" / "model.keras", tmp_path / "straight" / "model.keras")

    as_run = clean_env(OUTPUT_DIR=tmp_path / "straight", MODEL=None, TEST_OPTIMIZER=json.dumps(options))
    check = run_python(["-c", AVERAGES], cwd=tmp_path, env=as_run)
    assert check.returncode == 0, check.stderr[-3000:]
    assert json.loads(check.stdout.strip().splitlines()[-1]) == {
        "exported_is_average": True,
        "average_is_not_raw": True,
    }
    expected = read_summary(tmp_path / "straight")["eval"]
    evaluated = run_train("evaluate", "--output-dir", str(tmp_path / "straight"), cwd=tmp_path, MODEL=None,
                          TEST_OPTIMIZER=json.dumps(options))  # fmt: skip
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    report = json.loads(evaluated.stdout[evaluated.stdout.index("{") :])
    assert {name: report[name] for name in expected} == pytest.approx(expected, abs=1e-6)
