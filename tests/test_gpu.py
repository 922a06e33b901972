"""GPU tests, for machines that have them: `make test-gpu`. Each skips where TensorFlow sees no GPU, before it
builds anything. What the GPU runs' settings resolve to on one GPU and on several (strategy, precision, XLA, the
all-reduce) is checked everywhere, CI included, through the device seam with fake GPUs (tests/test_devices.py's
FakeDevices): the table below is what both the fake and the real runs must show.
"""

from __future__ import annotations

import json
import subprocess
import sys
from functools import cache

import pytest

from tests.conftest import WIDE_BYTES, clean_env, read_summary, run_train
from tests.test_devices import FakeDevices
from train.devices.runtime import choose_xla, configure_devices, resolve
from train.settings import load_settings

# The GPU runs' variants (test_fit_on_gpus_with_mixed_float16_and_every_all_reduce) and what each resolves to on one
# GPU and on several: {variant: (settings, {gpus: (strategy, precision, jit_compile, cross_device_ops)})}. XLA auto
# is on for one GPU (Keras's own default) and off under a strategy of several; None: TensorFlow's own all-reduce.
VARIANTS = {
    "mixed_float16": ({"MIXED_PRECISION": "mixed_float16"},
                      {1: ("one_device", "mixed_float16", True, None), 2: ("mirrored", "mixed_float16", False, None)}),
    "nccl": ({"CROSS_DEVICE_OPS": "nccl", "MIXED_PRECISION": "off"},
             {1: ("one_device", "float32", True, None), 2: ("mirrored", "float32", False, "nccl")}),
    "hierarchical_copy": ({"CROSS_DEVICE_OPS": "hierarchical_copy", "MIXED_PRECISION": "off"},
                          {1: ("one_device", "float32", True, None),
                           2: ("mirrored", "float32", False, "hierarchical_copy")}),
}  # fmt: skip
ALL_REDUCES = ("nccl", "hierarchical_copy")  # run on several GPUs only: on one, one_device has nothing to all-reduce


@pytest.mark.parametrize("count", [1, 2])
@pytest.mark.parametrize("variant", list(VARIANTS))
def test_what_the_gpu_runs_settings_resolve_to_on_one_gpu_and_on_several(count, variant):
    """Through the device seam with FakeDevices (no GPU needed, so CI runs it): the values the GPU runs assert."""
    environ, expected = VARIANTS[variant]
    chosen = load_settings({}, environ, "/nonexistent/.env")
    resolution = resolve(chosen, configure_devices(chosen, FakeDevices(count)))
    jit, _ = choose_xla(chosen.jit_compile, resolution, False, False, None)  # GPUs: tf.data feeds the replica step
    assert (resolution.strategy_name, resolution.precision, jit, resolution.cross_device_ops) == expected[count]
    assert len(resolution.devices) == count
    if variant in ALL_REDUCES and count == 1:
        assert any(f"CROSS_DEVICE_OPS={variant} has no effect" in note for note in resolution.notes)


@cache
def gpu_count() -> int:
    script = "import tensorflow as tf; print(len(tf.config.list_physical_devices('GPU')))"
    result = subprocess.run([sys.executable, "-c", script], env=clean_env(), capture_output=True, text=True)
    return int(result.stdout.strip().splitlines()[-1]) if result.returncode == 0 else 0


@cache
def compute_capability_major() -> int:
    """The first GPU's compute capability, major: bf16 needs 8 (Ampere) or later."""
    script = (
        "import tensorflow as tf; gpu = tf.config.list_physical_devices('GPU')[0]\n"
        "print(tf.config.experimental.get_device_details(gpu).get('compute_capability', (0, 0))[0])"
    )
    result = subprocess.run([sys.executable, "-c", script], env=clean_env(), capture_output=True, text=True)
    return int(result.stdout.strip().splitlines()[-1])


@pytest.fixture(scope="session")
def gpus() -> int:
    """The GPUs TensorFlow sees; session-scoped and first in each test's arguments, so a test skips before the
    fixtures after it (wide_data_dir's 262 MB) build anything."""
    count = gpu_count()
    if count == 0:
        pytest.skip("TensorFlow sees no GPU here")
    return count


@pytest.mark.gpu
def test_doctor_reports_every_gpu_with_name_and_memory(gpus, tmp_path):
    result = run_train("devices", "--json", cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr[-2000:]
    report = json.loads(result.stdout)
    assert len(report["gpus"]) == gpus
    assert all(gpu["name"] and gpu["memory_peak_mb"] is not None for gpu in report["gpus"])
    assert report["resolved"]["strategy"] == ("mirrored" if gpus > 1 else "one_device")


@pytest.mark.gpu
def test_memory_growth_is_applied_to_every_visible_gpu(gpus, tmp_path):
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


@pytest.mark.gpu
def test_fit_on_every_gpu(gpus, tmp_path, tfds_data_dir):
    result = run_train(
        "fit", cwd=tmp_path, TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=tmp_path / "run", EPOCHS=2, GPUS="all"
    )
    assert result.returncode == 0, result.stderr[-3000:]
    summary = read_summary(tmp_path / "run")
    assert summary["replicas"] == gpus
    assert summary["global_batch"] == 128 * gpus
    assert summary["eval"]["accuracy"] > 0.7


@pytest.mark.gpu
def test_asking_for_a_gpu_index_that_is_not_there_is_an_error(gpus, tmp_path):
    result = run_train("fit", cwd=tmp_path, OUTPUT_DIR=tmp_path / "run", GPUS=str(gpus))
    assert result.returncode == 2
    assert f"asks for GPU {gpus}, but TensorFlow sees {gpus} GPU(s)" in result.stderr


@pytest.mark.gpu
def test_fit_on_gpus_with_mixed_float16_and_every_all_reduce(gpus, tmp_path, tfds_data_dir):
    """float16 with loss scaling, then (with 2+ GPUs) NCCL and hierarchical copy: each trains and learns."""
    row = 1 if gpus == 1 else 2
    for name, (settings, expected) in VARIANTS.items():
        if name in ALL_REDUCES and gpus == 1:
            continue
        output_dir = tmp_path / name
        result = run_train(
            "fit", cwd=tmp_path, TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=output_dir, EPOCHS=2, **settings
        )
        assert result.returncode == 0, result.stderr[-3000:]
        summary = read_summary(output_dir)
        strategy, precision, jit, cross_device_ops = expected[row]
        assert (summary["precision"], summary["jit_compile"]) == (precision, jit), name
        assert summary["cross_device_ops"] == ("xla collective" if jit and gpus > 1 else cross_device_ops), name
        assert summary["replicas"] == (gpus if strategy == "mirrored" else 1), name
        assert summary["data_in_memory"], name
        assert summary["eval"]["accuracy"] > 0.7, name


@pytest.mark.gpu
def test_xla_on_one_and_two_gpus_with_and_without_mixed_precision(gpus, tmp_path, tfds_data_dir):
    """JIT_COMPILE=true compiles the replica step (tf.data stays outside) on 1 GPU and, where there are 2, on
    MirroredStrategy over 2; with each precision the GPUs have. fp16 on 2+ GPUs stays refused (keras#20763)."""
    precisions = ["off", "mixed_float16", *(["mixed_bfloat16"] if compute_capability_major() >= 8 else [])]
    for gpu_list in ["0", *(["0,1"] if gpus > 1 else [])]:
        for precision in precisions:
            output_dir = tmp_path / f"run-{gpu_list}-{precision}"
            result = run_train(
                "fit", cwd=tmp_path, TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=output_dir, EPOCHS=2, GPUS=gpu_list,
                JIT_COMPILE="true", MIXED_PRECISION=precision,
            )  # fmt: skip
            if "," in gpu_list and precision == "mixed_float16":
                assert result.returncode == 2 and "MIXED_PRECISION=mixed_float16 on more than one GPU" in result.stderr
                continue
            assert result.returncode == 0, result.stderr[-3000:]
            summary = read_summary(output_dir)
            assert summary["jit_compile"] and summary["precision"] == ("float32" if precision == "off" else precision)
            assert summary["replicas"] == len(gpu_list.split(","))
            assert summary["eval"]["accuracy"] > 0.7, (gpu_list, precision, summary["eval"])


@pytest.mark.gpu
def test_data_held_in_memory_stays_on_the_host_not_on_the_gpu(gpus, tmp_path, wide_data_dir):
    """The GPU-side figure of DATA_IN_MEMORY=true: the split (262 MB) stays in host memory and tf.data brings
    the GPU its batches, so the GPU's peak is the model and a few batches, not the split. Printed for the record."""
    script = (
        "import json, sys\n"
        "from train.fit import fit\n"
        "from train.signals import StopRequest\n"
        "from train.settings import load_settings\n"
        "fit(load_settings(), StopRequest(), say=lambda line: None)\n"
        "import tensorflow as tf\n"
        "print(json.dumps(tf.config.experimental.get_memory_info('GPU:0')))\n"
    )
    env = clean_env(
        DATASET="wide_values", TFDS_DATA_DIR=wide_data_dir, OUTPUT_DIR=tmp_path / "run", GPUS="0",
        DATA_IN_MEMORY="true", BATCH_SIZE=32, EPOCHS=1, STEPS_PER_EPOCH=20,
    )  # fmt: skip
    result = subprocess.run([sys.executable, "-c", script], cwd=tmp_path, env=env, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    peak = json.loads(result.stdout.strip().splitlines()[-1])["peak"]
    print(f"GPU peak with a {WIDE_BYTES / 1e6:.0f} MB split in memory: {peak / 1e6:.0f} MB")
    assert peak < WIDE_BYTES / 2, f"GPU peak {peak / 1e6:.0f} MB: the split was copied to the GPU"
