"""Accumulated steps against unaccumulated ones, through the engine's own build, feed and training calls.

    python -m tests.harness.accumulation same OPTIONS_JSON...  # a global batch of 64: 1 device at once, against
                                                               # 1 device x 4 micro-batches and 2 replicas x 2
    python -m tests.harness.accumulation overflow              # one micro-batch of one replica x1000, mixed_float16

Prints one JSON object. The model is tests/harness/options_model.py (its optimizer options: TEST_OPTIMIZER).
"""

from __future__ import annotations

import json
import os
import sys

import numpy as np
import tensorflow as tf

from tests.harness.replicas import MODEL, SPEC, arrays, weights
from train.data.feeds import RowsFeed, adapter
from train.keras_seams import loss_tracker
from train.model import build
from train.model_file import load_model_file
from train.settings import load_settings
from train.step import make_calls

GLOBAL_BATCH, STEPS = 64, 12


def train(strategy, settings, accumulation: int):
    built = build(settings, load_model_file(settings.model), SPEC, strategy)
    feed = adapter(strategy, arrays()).train_feed(GLOBAL_BATCH, settings.seed, 0, STEPS)
    calls = make_calls(built, strategy, feed, GLOBAL_BATCH, jit_compile=False, accumulation=accumulation)
    return built, calls(STEPS)


def same(options_list: list[str]) -> dict:
    """For each option set: the largest weight difference from the unaccumulated step, and the metrics."""
    one = tf.distribute.OneDeviceStrategy("/cpu:0")
    two = tf.distribute.MirroredStrategy(["/cpu:0", "/cpu:1"], cross_device_ops=tf.distribute.ReductionToOneDevice())
    report = {}
    for options in options_list:
        os.environ["TEST_OPTIMIZER"] = options
        settings = load_settings({"MODEL": MODEL, "LEARNING_RATE": "0.05"}, environ={}, defaults_path=None)
        reference, reference_result = train(one, settings, 1)
        outcome: dict = {"moved": max(float(np.max(np.abs(x))) for x in weights(reference)),
                         "metrics": reference_result.metrics}  # fmt: skip
        for name, strategy, accumulation in (("one_x4", one, 4), ("two_x2", two, 2)):
            built, result = train(strategy, settings, accumulation)
            pairs = zip(weights(reference), weights(built), strict=True)
            outcome[name] = {"max_difference": max(float(np.max(np.abs(x - y))) for x, y in pairs),
                             "metrics": result.metrics,
                             "iterations": int(built.optimizer.iterations.numpy())}  # fmt: skip
        report[options] = outcome
    return report


class OneMicroBatchScaled(RowsFeed):
    """The engine's own feed, with one micro-batch of one replica multiplied by 1000 (a float16 overflow inside
    an accumulation window): examples [2m, 3m) of replica 1's share, m = the share / 4."""

    def replica_batch(self, features, labels, rows):
        features, labels = super().replica_batch(features, labels, rows)
        replica = tf.distribute.get_replica_context().replica_id_in_sync_group
        share = features.shape[0]
        place = tf.range(share)[:, None]
        inside = (place >= share // 4 * 2) & (place < share // 4 * 3) & (replica == 1)
        return tf.where(inside, features * 1000.0, features), labels


def overflow() -> dict:
    """One step with an overflowing micro-batch (the third of four, on replica 1 of 2), then a normal step."""
    from train.devices.runtime import setup_runtime

    flags = {"MODEL": MODEL, "MIXED_PRECISION": "mixed_float16", "CPU_DEVICES": "2", "GLOBAL_BATCH_SIZE": "64",
             "BATCH_SIZE": "8"}  # fmt: skip
    settings = load_settings(flags, environ={}, defaults_path=None)
    runtime = setup_runtime(settings).with_precision("mixed_float16")
    strategy, accumulation = runtime.strategy, runtime.accumulation
    os.environ["TEST_OPTIMIZER"] = "{}"
    built = build(settings, load_model_file(settings.model), SPEC, strategy)
    before, scale_before = weights(built), built.loss_scale
    split = arrays()
    scaled = OneMicroBatchScaled(split, runtime.replicas, runtime.global_batch, settings.seed, 0, 1)
    first = make_calls(built, strategy, scaled, runtime.global_batch, False, accumulation)(1)
    after_overflow, scale_after = weights(built), built.loss_scale
    counted = float(loss_tracker(built.network).count.numpy())
    normal = adapter(strategy, split).train_feed(runtime.global_batch, settings.seed, 1, 1)
    second = make_calls(built, strategy, normal, runtime.global_batch, False, accumulation)(1)
    return {
        "accumulation": accumulation,
        "skipped": [first.skipped, second.skipped],
        "scale": [scale_before, scale_after, built.loss_scale],
        "unchanged_by_overflow": all(np.array_equal(x, y) for x, y in zip(before, after_overflow, strict=True)),
        "counted_after_overflow": counted,
        "counted_after_normal": float(loss_tracker(built.network).count.numpy()),
        "finite": all(np.isfinite(w).all() for w in weights(built)),
        "moved_after_normal_step": not all(np.array_equal(x, y) for x, y in zip(before, weights(built), strict=True)),
    }


if __name__ == "__main__":
    mode, args = sys.argv[1], sys.argv[2:]
    if mode == "same":
        cpu = tf.config.list_physical_devices("CPU")[0]
        tf.config.set_logical_device_configuration(cpu, [tf.config.LogicalDeviceConfiguration()] * 2)
        print(json.dumps(same(args)))
    else:
        print(json.dumps(overflow()))
