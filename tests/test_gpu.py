"""GPU tests, for machines that have them: `make test-gpu`. Each skips where TensorFlow sees no GPU."""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache

import pytest

from tests.conftest import clean_env, read_summary, run_train

pytestmark = pytest.mark.gpu


@cache
def gpu_count() -> int:
    script = "import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))"
    result = subprocess.run([sys.executable, "-c", script], env=clean_env(), capture_output=True, text=True)
    return int(result.stdout.strip().splitlines()[-1]) if result.returncode == 0 else 0


@pytest.fixture
def gpus() -> int:
    count = gpu_count()
    if count == 0:
        pytest.skip("TensorFlow sees no GPU here")
    return count


def test_doctor_reports_every_gpu_with_name_and_memory(tmp_path, gpus):
    result = run_train("devices", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert len(report["gpus"]) == gpus
    assert all(gpu["name"] and gpu["memory_peak_mb"] is not None for gpu in report["gpus"])
    assert report["resolved"]["strategy"] == ("mirrored" if gpus > 1 else "one_device")


def test_memory_growth_is_applied_to_every_visible_gpu(tmp_path, gpus):
    script = (
        "import tensorflow as tf\n"
        "from train.devices.runtime import setup_runtime\n"
        "from train.settings import load_settings\n"
        "setup_runtime(load_settings({'GPUS': 'all', 'MEMORY_GROWTH': 'true'}))\n"
        "print([tf.config.experimental.get_memory_growth(g) for g in tf.config.get_visible_devices('GPU')])\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=clean_env(), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr[-2000:]
    assert result.stdout.strip().splitlines()[-1] == str([True] * gpus)


def test_fit_on_every_gpu(tmp_path, tfds_data_dir, gpus):
    result = run_train(
        "fit", cwd=tmp_path, TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=tmp_path / "run", EPOCHS=2, GPUS="all"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(tmp_path / "run")
    assert summary["replicas"] == gpus
    assert summary["global_batch"] == 128 * gpus
    assert summary["eval"]["accuracy"] > 0.7


def test_asking_for_a_gpu_index_that_is_not_there_is_an_error(tmp_path, gpus):
    result = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "run", GPUS=str(gpus))
    assert result.returncode == 2
    assert f"asks for GPU {gpus}, but TensorFlow sees {gpus} GPU(s)" in result.stderr


def test_fit_on_gpus_with_mixed_float16_and_every_all_reduce(tmp_path, tfds_data_dir, gpus):
    """float16 with loss scaling, then (with 2+ GPUs) NCCL and hierarchical copy: each trains and learns."""
    variants = [{"MIXED_PRECISION": "mixed_float16"}]
    if gpus > 1:
        variants += [{"CROSS_DEVICE_OPS": ops} for ops in ("nccl", "hierarchical_copy")]
    for index, settings in enumerate(variants):
        output_dir = tmp_path / f"run{index}"
        result = run_train(
            "fit", cwd=tmp_path, TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=output_dir, EPOCHS=2, **settings
        )
        assert result.returncode == 0, result.stderr[-3000:]
        summary = read_summary(output_dir)
        assert summary["precision"] == settings.get("MIXED_PRECISION", summary["precision"])
        assert summary["cross_device_ops"] == settings.get("CROSS_DEVICE_OPS", summary["cross_device_ops"])
        assert summary["data_in_memory"] and not summary["jit_compile"]  # tf.data feeds GPUs: no XLA
        assert summary["eval"]["accuracy"] > 0.7
