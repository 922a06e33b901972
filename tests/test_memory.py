"""In memory means once in memory: what holding the splits costs, measured as the peak RSS of real fits.

The bound (peak RSS minus a tiny fit's) <= 1.5 x the splits' bytes as stored is what DATA_IN_MEMORY=auto
counts per worker on the host (train.devices.host_memory.PEAK_PER_BYTE)."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.conftest import WIDE_BYTES, clean_env
from train.devices.host_memory import PEAK_PER_BYTE


def peak_rss_of_fit(cwd, **settings) -> int:
    """The peak resident memory of a `python -m train fit` process, in bytes (the kernel's own account)."""
    process = subprocess.Popen(
        [sys.executable, "-m", "train", "fit"], cwd=cwd,
        env=clean_env(EPOCHS=1, STEPS_PER_EPOCH=5, JIT_COMPILE=None, **settings),  # the default path's memory
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )  # fmt: skip
    _, status, usage = os.wait4(process.pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0, process.stderr.read().decode()[-3000:]
    return usage.ru_maxrss * 1024


@pytest.mark.slow
def test_holding_a_split_costs_at_most_one_and_a_half_times_its_bytes(tmp_path, tfds_data_dir, wide_data_dir):
    tiny = peak_rss_of_fit(tmp_path, TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=tmp_path / "tiny")
    wide = {"DATASET": "wide_values", "TFDS_DATA_DIR": wide_data_dir, "BATCH_SIZE": 32, "DATA_IN_MEMORY": "true"}
    first = peak_rss_of_fit(tmp_path, **wide, OUTPUT_DIR=tmp_path / "first")  # read from the TFDS files
    again = peak_rss_of_fit(tmp_path, **wide, OUTPUT_DIR=tmp_path / "again")  # read from the arrays cache
    for peak in (first, again):
        assert peak - tiny <= PEAK_PER_BYTE * WIDE_BYTES, f"{(peak - tiny) / WIDE_BYTES:.2f} x the split's bytes"


# 16,957,450 float32 parameters (64.7 MiB): the accumulators, one copy of them, stand out of the process's peak.
WIDE_MODEL = """
import keras

def build_model(input_shape, num_classes, learning_rate):
    model = keras.Sequential([keras.Input(input_shape), keras.layers.Dense(4096, activation="relu"),
                              keras.layers.Dense(4096, activation="relu"), keras.layers.Dense(num_classes)])
    model.compile(optimizer=keras.optimizers.Adam(learning_rate),
                  loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model
"""
WIDE_MODEL_BYTES = 4 * (32 * 4096 + 4096 + 4096 * 4096 + 4096 + 4096 * 10 + 10)


@pytest.mark.slow
def test_accumulating_8_micro_batches_costs_about_one_copy_of_the_trainable_variables(tmp_path, tfds_data_dir):
    """The same micro-batch of 32, a step of 1 and of 8 of them: what the accumulators add to the peak (measured
    1.3x the variables' bytes with XLA, where its buffers for the loop add to them; 0 without, docs/performance.md).
    Bounded at 2x: one copy and XLA's buffers, far from a copy per micro-batch (8x). Both fits evaluate a part
    of each split at the end (the whole train split, through this wide model, was most of their CPU)."""
    (tmp_path / "wide.py").write_text(WIDE_MODEL)
    common = {"MODEL": "wide.py", "TFDS_DATA_DIR": tfds_data_dir, "BATCH_SIZE": 32, "TRAIN_SPLIT": "train[:2048]",
              "EVAL_SPLIT": "test[:256]"}  # fmt: skip
    once = peak_rss_of_fit(tmp_path, **common, GLOBAL_BATCH_SIZE=32, OUTPUT_DIR=tmp_path / "once")
    eight = peak_rss_of_fit(tmp_path, **common, GLOBAL_BATCH_SIZE=256, OUTPUT_DIR=tmp_path / "eight")
    assert eight - once <= 2 * WIDE_MODEL_BYTES, f"{(eight - once) / WIDE_MODEL_BYTES:.2f} x the variables' bytes"
