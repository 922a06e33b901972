"""The benchmark: a short form runs in a fresh process and writes every figure. It proves the command works;
it does not judge speed (the CPU running the tests is shared and its figures are noise)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import clean_env, run_python, run_train
from train.tools.bench import CONTENDERS, RATIO_GOALS, format_benchmark

# One round of the shortest measurements (make bench's smallest setting measures 0.05 s too): what is asserted is
# that each figure is there and positive, not what it is; a measurement runs whole calls, at least one.
SHORT = ("--repetitions", "1", "--seconds", "0.05")


def judged(goal: dict) -> bool:
    """Whether a measured goal is met, from its own value, target and comparison (the bench's verdict must agree)."""
    assert goal["value"] is not None, goal
    return goal["value"] >= goal["target"] if goal["comparison"] == ">=" else goal["value"] < goal["target"]


def run_bench(*args: str, cwd: Path, data_dir: Path, timeout: float = 600, **settings: object) -> dict:
    """`python -m train bench ARGS --json FILE` in its own process; returns the JSON it wrote."""
    out = cwd / "bench.json"
    env = clean_env(TFDS_DATA_DIR=data_dir, JIT_COMPILE=None, **settings)  # the benchmark measures the defaults
    result = run_python(["-m", "train", "bench", *args, "--json", str(out)], cwd=cwd, env=env, timeout=timeout)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "goals (docs/performance.md):" in result.stdout
    return json.loads(out.read_text())


@pytest.mark.slow
def test_short_benchmark_measures_every_contender_and_the_three_ratios_with_the_settings_as_flags(
    tmp_path, tfds_data_dir
):
    result = run_bench(*SHORT, "--no-startup", "--batch-size", "64", "--steps-per-call", "8", cwd=tmp_path,
                       data_dir=tfds_data_dir)  # fmt: skip
    assert result["schema"] == 1
    assert (result["dataset"], result["model"]) == ("synthetic_clusters/1.0.0", "examples.mlp")
    assert (result["resolved"]["strategy"], result["resolved"]["global_batch"], result["steps_per_call"]) == (
        "one_device", 64, 8,
    )  # fmt: skip
    assert set(result["contenders"]) == set(CONTENDERS)
    for name, contender in result["contenders"].items():
        assert contender["examples_per_sec"] > 0, name
        assert len(contender["runs"]) == 1
    assert result["contenders"]["keras_numpy"]["global_batch"] == 32
    for streaming in ("streamed", "tuned_tfdata"):  # the template's step, fed from the TFDS files
        assert result["contenders"][streaming]["global_batch"] == 64
    # The template's streamed feed hands whole calls their blocks: XLA compiles the call. The tuned pipeline is
    # read a step at a time, an iterator XLA cannot compile: XLA stays off for it on CPU, as fit would have it.
    assert result["contenders"]["streamed"]["settings"] == "STEPS_PER_CALL=8, XLA on"
    assert result["contenders"]["tuned_tfdata"]["settings"] == "STEPS_PER_CALL=8, XLA off"
    for pipeline in ("streamed_input", "tuned_tfdata_input"):  # the same two pipelines, timed without the step
        assert result["contenders"][pipeline]["settings"] == "input only, no step"
    for ratio in RATIO_GOALS["vectors"]:
        assert result["ratios"][ratio] > 0
    assert len(result["goals"]) == 5 and all(goal["met"] is judged(goal) for goal in result["goals"])
    accumulated = result["contenders"]["accumulated"]  # the template's micro-batch of 64, 4 of them a step
    assert accumulated["global_batch"] == 256 and accumulated["settings"].endswith("4 micro-batches of 64 a step")
    assert result["startup"] is None and result["replicas"] is None
    shares = result["shares"]  # what 1, 2 and 4 workers each read of the streamed split
    assert [len(shares[count]) for count in ("1", "2", "4")] == [1, 2, 4]
    assert [sum(w["share_examples"] for w in shares[count]) for count in ("1", "2", "4")] == [16384] * 3


@pytest.mark.slow
def test_the_image_example_row_measures_the_cnn_against_its_ceiling_and_a_tuned_tfdata_pipeline(
    tmp_path, examples_data_dir
):
    """(Keras fit, row 3, is the same code as on the default dataset, measured there: left out for time.)"""
    contenders = "template,accumulated,in_memory,streamed,tuned_tfdata,streamed_input,tuned_tfdata_input"
    result = run_bench(
        *SHORT, "--no-startup", "--contenders", contenders, "--batch-size", "32", "--steps-per-call", "4",
        cwd=tmp_path, data_dir=examples_data_dir, MODEL="examples.cnn", DATASET="synthetic_images",
        TRAIN_SPLIT="train[:1024]",
    )  # fmt: skip
    assert (result["model"], result["feature"]) == ("examples.cnn", {"shape": [32, 32, 3], "dtype": "uint8"})
    assert set(result["ratios"]) == {"1a/1", "1/2", "5/1", "5/6", "5i/6i"}
    goals = {goal["goal"].split()[0]: goal for goal in result["goals"]}
    assert set(goals) == {"1/2", "1/3", "5/6", "1a/1"}
    assert all(goal["goal"].endswith("(images)") for goal in goals.values())
    assert goals["5/6"]["met"] is judged(goals["5/6"]) and goals["1a/1"]["met"] is judged(goals["1a/1"])
    assert goals["1/3"]["met"] is None


@pytest.mark.slow
def test_the_photos_row_measures_the_template_input_against_a_tuned_pipeline_running_the_same_preprocess(
    tmp_path, photos_data_dir
):
    """make bench-images: examples/resnet.py's preprocess on synthetic_photos (images of their own size, JPEG).
    The rows that train on arrays of the stored feature are left out; the input rows are measured."""
    contenders = "template,in_memory,keras_fit,streamed_input,tuned_tfdata_input"
    result = run_bench(
        *SHORT, "--no-startup", "--contenders", contenders, "--batch-size", "32", cwd=tmp_path,
        data_dir=photos_data_dir, MODEL="examples.resnet", DATASET="synthetic_photos", TRAIN_SPLIT="train[:512]",
    )  # fmt: skip
    assert result["inputs"] == "inputs [64, 64, 3] uint8"
    assert set(result["contenders"]) == {"template", "streamed_input", "tuned_tfdata_input"}
    for contender in result["contenders"].values():
        assert contender["examples_per_sec"] > 0 and contender["examples_per_cpu_sec"] > 0
    goals = {goal["goal"].split()[0]: goal for goal in result["goals"]}
    assert set(goals) == set(RATIO_GOALS["preprocess"]) and goals["5i/6i"]["met"] is judged(goals["5i/6i"])


@pytest.mark.slow
def test_the_text_row_measures_the_template_input_against_a_tuned_pipeline_running_the_same_preprocess(
    tmp_path, text_data_dir
):
    """make bench-text: examples/text.py (a TextVectorization adapted in adapt, applied in preprocess) on
    synthetic_reviews: the input rows alone, the template's against a tuned tf.data pipeline."""
    result = run_bench(
        *SHORT, "--no-startup", "--contenders", "template,streamed_input,tuned_tfdata_input", "--batch-size", "32",
        cwd=tmp_path, data_dir=text_data_dir, MODEL="examples.text", DATASET="synthetic_reviews",
        TRAIN_SPLIT="train[:1024]",
    )  # fmt: skip
    assert result["inputs"] == "inputs [200] int64"
    assert set(result["contenders"]) == {"template", "streamed_input", "tuned_tfdata_input"}
    for contender in result["contenders"].values():
        assert contender["examples_per_sec"] > 0 and contender["examples_per_cpu_sec"] > 0
    goals = {goal["goal"].split()[0]: goal for goal in result["goals"]}
    assert goals["5i/6i"]["met"] is judged(goals["5i/6i"])


def test_bench_gpu_without_a_gpu_says_it_needs_one_and_exits_0(tmp_path):
    result = run_train("bench", "--compare-replicas", "--require-gpus", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "bench-gpu measures how training scales over GPUs, and TensorFlow sees none here" in result.stdout


def test_unknown_lever_is_refused_before_anything_runs(tmp_path):
    result = run_train("bench", "--levers", "JIT,STEPS_PER_CALL", cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == (
        "error: --levers JIT is not a lever: use all or some of STEPS_PER_CALL, JIT_COMPILE, MIXED_PRECISION, "
        "DATA_IN_MEMORY, CROSS_DEVICE_OPS, DEVICE_PREFETCH, SYNC_BATCH_NORM"
    )


def test_the_report_names_every_figure_and_says_which_goals_are_met():
    contender = {"runs": [100.0], "spread": None, "global_batch": 128, "strategy": "one_device", "crashed": []}
    result = {
        "dataset": "d/1.0.0",
        "model": "examples.mlp",
        "train_examples": 1000,
        "feature": {"shape": [32], "dtype": "float32"},
        "resolved": {"replicas": 1, "strategy": "one_device", "global_batch": 128},
        "steps_per_call": 32,
        "tensorflow": "2.x",
        "repetitions": 1,
        "seconds_per_measurement": 0.2,
        "contenders": {
            "template": {
                **contender,
                "label": "1  template",
                "examples_per_sec": 90.0,
                "settings": "S=32",
                "runs": [80.0, 90.0, 98.0],
                "spread": 0.2,
            },
            "keras_fit": {
                **contender,
                "label": "3  Keras fit",
                "examples_per_sec": 100.0,
                "settings": "steps_per_execution=1",
                "strategy": "mirrored",
                "crashed": ["mirrored, steps_per_execution=32: InvalidArgumentError: boom"],
            },
        },
        "ratios": {"1/3": 0.9},
        "startup": None,
        "replicas": None,
        "goals": [
            {"goal": "1/3 faster", "value": 0.9, "target": 1.2, "comparison": ">=", "met": False},
            {"goal": "1/2 pipeline", "value": None, "target": 0.85, "comparison": ">=", "met": None},
        ],
    }
    text = format_benchmark(result)
    assert "1/3 faster" in text and "NOT met" in text and "not measured" in text
    assert "[mirrored only]" in text and "crashed: mirrored, steps_per_execution=32" in text
    rows = {line.split("  ")[0]: line.split() for line in text.splitlines() if line.startswith(("1  ", "3  "))}
    assert rows["1"][3] == "20%" and rows["3"][4] == "-"  # the spread of 3 rounds; none for a single round

    resolved = {"strategy": "one_device", "precision": "float32", "template": "XLA on"}
    result["levers"] = {
        "STEPS_PER_CALL": [
            {"value": "32", "label": "STEPS_PER_CALL=32", "examples_per_sec": 100.0, "resolved": resolved},
            {"value": "128", "label": "STEPS_PER_CALL=128 LOG_EVERY=1280", "examples_per_sec": 150.0,
             "resolved": resolved},
        ],
        "JIT_COMPILE": [
            {"value": "true", "label": "JIT_COMPILE=true", "examples_per_sec": None,
             "error": "error: JIT_COMPILE=true is not allowed here"},
        ],
    }  # fmt: skip
    lines = format_benchmark(result).splitlines()
    assert any(line.split()[:3] == ["STEPS_PER_CALL=128", "LOG_EVERY=1280", "150"] for line in lines)
    assert any("1.50x" in line for line in lines if "LOG_EVERY=1280" in line)
    assert any(line.split()[:3] == ["JIT_COMPILE=true", "not", "run:"] for line in lines)


def test_importing_the_benchmark_does_not_start_tensorflow():
    code = "import sys, train.tools.bench; print('tensorflow' in sys.modules)"
    result = subprocess.run([sys.executable, "-c", code], env=clean_env(), capture_output=True, text=True)
    assert result.stdout.strip() == "False", result.stderr[-2000:]


@pytest.mark.slow
def test_make_bench_end_to_end_at_its_smallest_setting_with_tfds_data_dir_set_empty(tmp_path, tfds_data_dir):
    """`make bench` as a user runs it, with `TFDS_DATA_DIR=` empty in the environment (`docker run -e
    TFDS_DATA_DIR=`): TFDS's default (HOME's) for every process, the tiny fits' too, never a working directory;
    two start-up rounds, so that a second tiny fit would find what a first wrote there."""
    import shutil

    from tests.conftest import REPO

    home = tmp_path / "home"
    shutil.copytree(tfds_data_dir, home / "tensorflow_datasets", ignore=shutil.ignore_patterns("*.lock"))
    venv = Path(sys.prefix)
    out = tmp_path / "bench.json"
    smallest = "BENCH_ARGS=--repetitions 2 --seconds 0.05 --contenders template"  # 2: two tiny fits, one cwd
    command = ["make", "--no-print-directory", "-C", str(REPO), "-o", str(venv / "bin" / ".installed"), "bench",
               f"VENV={venv}", f"BENCH_JSON={out}", smallest]  # fmt: skip
    env = clean_env(HOME=home, TFDS_DATA_DIR="", TMPDIR=tmp_path)
    result = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert "Traceback" not in result.stdout + result.stderr
    measured = json.loads(out.read_text())
    assert len(measured["startup"]["runs"]["tiny_fit"]) == 2 and measured["startup"]["tiny_fit_seconds"] > 0
    assert list(measured["contenders"]) == ["template"] and measured["contenders"]["template"]["examples_per_sec"] > 0
    assert "goals (docs/performance.md):" in result.stdout
    assert [path for path in tmp_path.rglob("synthetic_clusters") if home not in path.parents] == []
    assert not (REPO / "synthetic_clusters").exists()
