"""scripts/bench_formats.py (`make bench-formats`, issue 57): a run's SavedModel, ONNX and LiteRT timed side by side.

Its figures are a benchmark's, not assertions: this checks that it runs on a tiny model's artifacts, prints a row
of positive figures for each runtime, and says which artifact is missing rather than failing on it."""

from __future__ import annotations

import json
import re
from pathlib import Path

from tests.conftest import REPO, needs, run_python

pytestmark = needs("formats")  # issue 57's formats extra: tf2onnx, onnx, onnxruntime, ai-edge-litert

# A run's artifacts as Keras writes them, for a tiny model: model.keras, saved_model/, formats/model.{onnx,tflite}
ARTIFACTS = """
import sys
from pathlib import Path
import keras, numpy as np
run = Path(sys.argv[1])
inputs = keras.Input(shape=(8,), name="features")
model = keras.Model(inputs, keras.layers.Dense(3, activation="softmax", name="scores")(keras.layers.Dense(16)(inputs)))
model(np.zeros((1, 8), "float32"))
model.save(run / "model.keras")
model.export(run / "saved_model", format="tf_saved_model", verbose=False)
(run / "formats").mkdir()
model.export(run / "formats" / "model.onnx", format="onnx", verbose=False)
model.export(run / "formats" / "model.tflite", format="litert", verbose=False)
"""
BENCH = "import runpy, sys; sys.argv = sys.argv[1:]; runpy.run_path(sys.argv[0], run_name='__main__')"
FEW = ["--repeats", "5", "--batch-repeats", "3", "--warmup", "1", "--batch", "32"]
NUMBER = r"[\d,.]+"


def bench(run: Path, *args: str):
    return run_python(
        ["-c", BENCH, str(REPO / "scripts" / "bench_formats.py"), "--output-dir", str(run), *FEW, *args], cwd=run.parent
    )


def rows(stdout: str) -> dict[str, list[float]]:
    """Each row's runtime: its figures (MB, load s, latency and its p10-p90, throughput and its p10-p90)."""
    found = {}
    for line in stdout.splitlines():
        match = re.match(r"^(saved_model|onnxruntime|litert)\s+\S+(?: serving_default| serve_inputs)?\s+(.*)$", line)
        if match:
            numbers = re.findall(NUMBER, match.group(2).replace("-", " "))
            found[match.group(1)] = [float(number.replace(",", "")) for number in numbers]
    return found


def test_each_runtime_gets_a_row_of_figures_and_a_missing_artifact_a_line(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    made = run_python(["-c", ARTIFACTS, str(run)], cwd=tmp_path)
    assert made.returncode == 0, made.stderr[-3000:]

    result = bench(run, "--json", str(tmp_path / "bench.json"))
    assert result.returncode == 0, result.stderr[-3000:]
    figures = rows(result.stdout)
    assert set(figures) == {"saved_model", "onnxruntime", "litert"}, result.stdout
    for runtime, numbers in figures.items():
        assert len(numbers) == 8, (runtime, result.stdout)
        assert all(number > 0 for number in numbers[2:]), (runtime, result.stdout)  # MB and load s may round to 0
    assert re.search(r"machine: \d+ CPUs .*tensorflow [\d.]+.*onnxruntime [\d.]+.*ai-edge-litert [\d.]+", result.stdout)
    report = json.loads((tmp_path / "bench.json").read_text())
    assert [row["runtime"] for row in report["rows"]] == ["saved_model", "onnxruntime", "litert"]
    assert report["inputs"] == [{"name": "features", "shape": [None, 8], "dtype": "float32"}]
    assert all(row["latency_ms"]["median"] > 0 and row["examples_per_s"]["median"] > 0 for row in report["rows"])

    (run / "formats" / "model.onnx").unlink()
    result = bench(run)
    assert result.returncode == 0, result.stderr[-3000:]
    assert f"not found: {run / 'formats' / 'model.onnx'}: run python -m train formats" in result.stdout
    assert set(rows(result.stdout)) == {"saved_model", "litert"}
