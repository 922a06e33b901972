"""Training steps on 1 replica against 2, through the engine's own build, feed and training calls.

    python -m tests.harness.replicas same OPTIONS_JSON...  # 1 vs 2 replicas at one global batch, per option set
    python -m tests.harness.replicas overflow              # replica 1's input x1000 for one step, mixed_float16
    TF_CONFIG=... python -m tests.harness.replicas overflow  # the same on 2 workers: worker 1's input
    python -m tests.harness.replicas random                # what the CNN example's random layers draw per replica

Prints one JSON object. The model is tests/harness/options_model.py, whose optimizer options come from the
TEST_OPTIMIZER environment variable (JSON), so each option set is the same model and data otherwise.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import numpy as np
import tensorflow as tf

from train.context import Context
from train.data.feeds import RowsFeed, adapter
from train.data.source import Split
from train.data.spec import DatasetSpec
from train.devices.runtime import setup_runtime
from train.model import build
from train.model_file import load_model_file
from train.settings import load_settings
from train.step import make_calls

SPEC = DatasetSpec("arrays", "features", "label", (32,), "float32", False, (), "int64", 10, 512, 0)
MODEL = str(Path(__file__).with_name("options_model.py"))  # by its path, wherever this runs (an empty folder)


def arrays(seed: int = 0) -> Split:
    rng = np.random.default_rng(seed)
    labels = rng.integers(10, size=512)
    features = (rng.normal(size=(10, 32))[labels] + rng.normal(size=(512, 32))).astype(np.float32)
    return Split(features, labels.astype(np.int64))


def weights(built) -> list[np.ndarray]:
    return [np.asarray(w.numpy()) for w in built.serving.weights]


def train(strategy, settings, steps: int, global_batch: int):
    built = build(settings, load_model_file(settings.model), SPEC, strategy)
    feed = adapter(strategy, arrays()).train_feed(global_batch, settings.seed, 0, steps)
    result = make_calls(built, strategy, feed, global_batch, jit_compile=False)(steps)
    return built, result


def same(options_list: list[str]) -> dict:
    """For each option set: the largest weight difference between 1 and 2 replicas, and both metrics."""
    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    two = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"], cross_device_ops=tf.distribute.ReductionToOneDevice())
    report = {}
    for options in options_list:
        os.environ["TEST_OPTIMIZER"] = options
        settings = load_settings({"MODEL": MODEL, "LEARNING_RATE": "0.05"}, environ={}, defaults_path=None)
        (a, ra), (b, rb) = train(one, settings, 12, 64), train(two, settings, 12, 64)
        report[options] = {
            "max_difference": max(float(np.max(np.abs(x - y))) for x, y in zip(weights(a), weights(b), strict=True)),
            "moved": max(float(np.max(np.abs(x))) for x in weights(a)),
            "metrics_one": ra.metrics,
            "metrics_two": rb.metrics,
        }
    return report


class ScaledFeed(RowsFeed):
    """The engine's own feed, with one replica's batch multiplied by 1000 (a controlled float16 overflow)."""

    scaled_replica = 1

    def replica_batch(self, features, labels, rows):
        features, labels = super().replica_batch(features, labels, rows)
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        return tf.where(replica == self.scaled_replica, features * 1000.0, features), labels


def overflow() -> dict:
    """One step with replica 1's input x1000, then a normal step, under mixed_float16 loss scaling."""
    settings = load_settings({"MODEL": MODEL, "MIXED_PRECISION": "mixed_float16", "CPU_DEVICES": "2",
                              "BATCH_SIZE": "32"}, defaults_path=None)  # fmt: skip
    runtime = setup_runtime(settings).with_precision("mixed_float16")
    strategy = runtime.strategy
    os.environ["TEST_OPTIMIZER"] = "{}"
    built = build(settings, load_model_file(settings.model), SPEC, strategy)
    before, scale_before = weights(built), built.loss_scale
    split = arrays()
    scaled = ScaledFeed(split, runtime.replicas, runtime.global_batch, settings.seed, 0, 1)
    first = make_calls(built, strategy, scaled, runtime.global_batch, jit_compile=False)(1)
    after_overflow, scale_after = weights(built), built.loss_scale
    copies = [
        [np.asarray(v.numpy()) for v in strategy.experimental_local_results(w.value)] for w in built.serving.weights
    ]
    normal = adapter(strategy, split).train_feed(runtime.global_batch, settings.seed, 1, 1)
    second = make_calls(built, strategy, normal, runtime.global_batch, jit_compile=False)(1)
    return {
        "replicas": runtime.replicas,
        "worker": runtime.worker_index,
        "skipped": [first.skipped, second.skipped],
        "scale": [scale_before, scale_after, built.loss_scale],
        "unchanged_by_overflow": all(np.array_equal(x, y) for x, y in zip(before, after_overflow, strict=True)),
        "finite": all(np.isfinite(w).all() for w in weights(built)),
        "replica_copies_equal": all(all(np.array_equal(c[0], other) for other in c[1:]) for c in copies),
        "moved_after_normal_step": not all(np.array_equal(x, y) for x, y in zip(before, weights(built), strict=True)),
        "weights_sha": __import__("hashlib").sha256(b"".join(w.tobytes() for w in weights(built))).hexdigest(),
    }


def random_draws() -> dict:
    """The CNN example (augmentation, dropout) on 2 logical CPUs: one image batch through each replica."""
    cpu = tf.config.list_physical_devices("CPU")[0]
    tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
    strategy = tf.distribute.MirroredStrategy(
        ["/cpu:0", "/cpu:1"], cross_device_ops=tf.distribute.ReductionToOneDevice()
    )
    spec = DatasetSpec("images", "image", "label", (32, 32, 3), "uint8", True, (), "int64", 10, 64, 0)
    settings = load_settings({"MODEL": "examples.cnn"}, environ={}, defaults_path=None)
    # the facts its learning-rate schedule reads (no sample: it adapts nothing)
    context = Context(global_batch=64, replicas=2, workers=1, steps_per_epoch=1, epochs=1, seed=settings.seed,
                      precision="float32")  # fmt: skip
    built = build(settings, load_model_file(settings.model), spec, strategy, context)
    images = tf.constant(np.random.default_rng(0).integers(0, 256, size=(4, 32, 32, 3)), tf.uint8)

    def outputs(training: bool) -> list[np.ndarray]:
        run = tf.function(lambda: strategy.run(lambda: built.serving(images, training=training)))
        return [np.asarray(t) for t in strategy.experimental_local_results(run())]

    training, inference = outputs(True), outputs(False)
    return {
        "replicas_draw_alike": bool(np.array_equal(training[0], training[1])),
        "inference_alike": bool(np.array_equal(inference[0], inference[1])),
        "first_draw": __import__("hashlib").sha256(training[0].tobytes()).hexdigest(),
        "seed_states": len(built.seeds),
    }


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "random":
        print(json.dumps(random_draws()))
    elif mode == "same":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        print(json.dumps(same(args)))
    else:
        print(json.dumps(overflow()))
