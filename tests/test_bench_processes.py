"""The benchmark's measurements that run in processes of their own (start-up, replica counts, levers): short
forms that prove the code paths work, bench-gpu's included, on 1 and 2 logical CPUs. Not a judge of speed."""

from __future__ import annotations

import pytest

from tests.test_bench import SHORT, run_bench


@pytest.mark.slow
def test_on_two_logical_cpus_it_runs_mirrored_and_measures_levers_value_by_value(tmp_path, tfds_data_dir):
    """Keras fit may crash under MirroredStrategy with some settings: the benchmark says so and goes on. A lever
    value the settings refuse here is reported with its error."""
    # the levers bench-gpu measures (CROSS_DEVICE_OPS's choices are tests/test_devices.py's)
    levers = "JIT_COMPILE,MIXED_PRECISION,DEVICE_PREFETCH"
    result = run_bench(*SHORT, "--no-startup", "--contenders", "template,keras_fit", "--levers", levers,
                       cwd=tmp_path, data_dir=tfds_data_dir, CPU_DEVICES=2, BATCH_SIZE=32)  # fmt: skip
    assert (result["resolved"]["strategy"], result["resolved"]["global_batch"]) == ("mirrored", 64)
    assert all(contender["examples_per_sec"] > 0 for contender in result["contenders"].values())
    assert result["contenders"]["template"]["strategy"] == "mirrored"
    without, with_xla = result["levers"]["JIT_COMPILE"]
    assert without["examples_per_sec"] > 0 and without["resolved"]["template"].endswith("XLA off")
    assert with_xla["examples_per_sec"] is None  # XLA cannot compile a mirrored step: refused, and said why
    assert with_xla["error"].startswith(
        "error: JIT_COMPILE=true is not allowed with MirroredStrategy on CPU devices (2 replicas, CPU_DEVICES=2)"
    )
    for lever, values in (("MIXED_PRECISION", ["off", "mixed_bfloat16"]), ("DEVICE_PREFETCH", ["1", "2", "4"])):
        measured = result["levers"][lever]
        assert [value["value"] for value in measured] == values
        assert all(value["examples_per_sec"] > 0 and value["resolved"]["replicas"] == 2 for value in measured)
    precisions = [value["resolved"]["precision"] for value in result["levers"]["MIXED_PRECISION"]]
    assert precisions == ["float32", "mixed_bfloat16"]  # each value really ran with its own dtype policy


@pytest.mark.slow
def test_startup_and_replica_comparison_run_in_subprocesses(tmp_path, tfds_data_dir):
    result = run_bench(
        *SHORT, "--compare-replicas", "--contenders", "template,in_memory", cwd=tmp_path, data_dir=tfds_data_dir
    )
    assert set(result["contenders"]) == {"template", "in_memory"}
    assert set(result["ratios"]) == {"1/2"}
    startup = result["startup"]
    assert all(startup[key] > 0 for key in ("help_seconds", "import_tensorflow_seconds", "tiny_fit_seconds"))
    seconds = {key: round(startup[key], 2) for key in ("help_seconds", "import_tensorflow_seconds", "tiny_fit_seconds")}
    print(f"startup: {seconds}")  # timings: printed, not asserted
    replicas = result["replicas"]  # the code path bench-gpu takes on GPUs, here on 1 and 2 logical CPUs
    assert replicas["devices"] == "cpu"
    assert [config["resolved"]["global_batch"] for config in replicas["configs"].values()] == [128, 128, 256]
    assert [row["replicas"] for row in replicas["scaling"]] == [1, 1, 2]
    assert replicas["scaling"][0]["efficiency"] == 1.0 and replicas["scaling"][2]["per_replica"] > 0
    assert all(config["examples_per_sec"]["accumulated"] > 0 for config in replicas["configs"].values())  # bench-gpu's
    assert replicas["mirrored_2_vs_one_device"] > 0 and replicas["mirrored_2_vs_one_device_without_xla"] > 0
    goals = {goal["goal"]: goal for goal in result["goals"]}
    mirrored = goals["mirrored on 2 CPU devices / one device"]
    assert mirrored["value"] == replicas["mirrored_2_vs_one_device"]
    assert mirrored["met"] is (mirrored["value"] >= mirrored["target"])
    assert goals["1/3 faster than Keras fit at its best (vectors)"]["met"] is None  # no Keras contender here
    assert not list(tmp_path.glob("runs")), "the tiny fit writes to a temporary OUTPUT_DIR, not the working directory"
