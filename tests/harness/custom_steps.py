"""A model's own train_step through the engine's training calls, against Keras's `model.fit` of the same model.

    python -m tests.harness.custom_steps fit REPLICAS [xla]  # 8 steps at a global batch of 64, both ways
    TF_CONFIG=... python -m tests.harness.custom_steps engine  # the engine alone (2 workers: fit cannot run there)

Prints one JSON object. The model is examples/custom_step.py (the Keras guide's override, a metric of its own);
`model.fit` gets the very batches the engine's feed plans (pass 0's order, each global batch split over the
replicas in order, as tf.distribute splits fit's batches).
"""

from __future__ import annotations

import hashlib
import json
import sys
from pathlib import Path

import keras
import numpy as np
import tensorflow as tf

from examples.custom_step import build_model
from train.data.feeds import adapter, pass_order
from train.data.source import Split
from train.data.spec import DatasetSpec
from train.devices.runtime import setup_runtime
from train.model import build
from train.model_file import load_model_file
from train.settings import load_settings
from train.step import make_calls

# by its path from the repository, wherever this runs (the tests run it in an empty folder: no .env there)
CUSTOM_STEP = str(Path(__file__).resolve().parents[2] / "examples" / "custom_step.py")
SPEC = DatasetSpec("arrays", "features", "label", (32,), "float32", False, (), "int64", 10, 512, 0)
STEPS, GLOBAL_BATCH, LEARNING_RATE = 8, 64, 0.05


def arrays() -> Split:
    rng = np.random.default_rng(0)
    labels = rng.integers(10, size=512)
    features = (rng.normal(size=(10, 32))[labels] + rng.normal(size=(512, 32))).astype(np.float32)
    return Split(features, labels.astype(np.int64))


def weights(model) -> list[np.ndarray]:
    return [np.asarray(w.numpy()) for w in model.weights]


def engine(strategy, settings, xla: bool = False) -> tuple[list[np.ndarray], dict]:
    """STEPS steps in calls of 4 (STEPS_PER_CALL), XLA compiling each whole call or not."""
    built = build(settings, load_model_file(settings.model), SPEC, strategy)
    feed = adapter(strategy, arrays()).train_feed(GLOBAL_BATCH, settings.seed, 0, 4)
    calls = make_calls(built, strategy, feed, GLOBAL_BATCH, jit_compile=xla)
    result = [calls(4) for _ in range(STEPS // 4)][-1]
    return weights(built.network), result.metrics


def keras_fit(strategy, settings) -> tuple[list[np.ndarray], dict]:
    split = arrays()
    rows = pass_order(len(split), settings.seed, 0).numpy()[: STEPS * GLOBAL_BATCH]
    keras.utils.set_random_seed(settings.seed)  # as train.model.build seeds it
    with strategy.scope():
        model = build_model(SPEC.input_shape, SPEC.num_classes, LEARNING_RATE)
    history = model.fit(split.features[rows], split.labels[rows], batch_size=GLOBAL_BATCH, shuffle=False, verbose=0)
    return weights(model), {name: values[-1] for name, values in history.history.items()}


def compare(replicas: int, xla: bool) -> dict:
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    settings = load_settings({"MODEL": CUSTOM_STEP, "LEARNING_RATE": str(LEARNING_RATE)}, environ={},
                             defaults_path=None)  # fmt: skip
    if replicas == 1:
        strategy = tf.distribute.OneDeviceStrategy("/cpu:0")
    else:
        strategy = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"],
                                                  cross_device_ops=tf.distribute.ReductionToOneDevice())  # fmt: skip
    (ours, ours_metrics), (fits, fit_metrics) = engine(strategy, settings, xla), keras_fit(strategy, settings)
    return {
        "max_difference": max(float(np.max(np.abs(a - b))) for a, b in zip(ours, fits, strict=True)),
        "moved": max(float(np.max(np.abs(a))) for a in ours),
        "engine": ours_metrics,
        "fit": fit_metrics,
    }


def engine_alone() -> dict:
    """The engine's custom step on this process's runtime (CPU_DEVICES, TF_CONFIG), at the same global batch."""
    settings = load_settings({"MODEL": CUSTOM_STEP, "LEARNING_RATE": str(LEARNING_RATE),
                              "GLOBAL_BATCH_SIZE": str(GLOBAL_BATCH), "WORKER_START_TIMEOUT": "60"},
                             defaults_path=None)  # fmt: skip
    runtime = setup_runtime(settings)
    ours, metrics = engine(runtime.strategy, settings)
    digest = hashlib.sha256(b"".join(w.tobytes() for w in ours)).hexdigest()
    return {"replicas": runtime.replicas, "workers": runtime.workers, "weights": [w.tolist() for w in ours],
            "sha": digest, "metrics": metrics}  # fmt: skip


if __name__ == "__main__":
    if sys.argv[1] == "fit":
        print(json.dumps(compare(int(sys.argv[2]), sys.argv[3:] == ["xla"])))
    else:
        print(json.dumps(engine_alone()))
