"""Runs several test files share: two workers forked from the test server, a resized-photos model, a run taken
back to an earlier checkpoint, and the distance between two exports' weights."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from collections.abc import Sequence
from pathlib import Path

from tests.conftest import clean_env, run_python, start_python

# Any model on a folder of photos: 8x8 pixels and one Dense layer (the layout and the data are what is tested).
RESIZED = """
import keras, tensorflow as tf
def preprocess(example, training, seed):
    return tf.image.resize(example["image"], (8, 8)) / 255, example["label"]
def build_model(input_shape, num_classes, learning_rate):
    model = keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(), keras.layers.Dense(num_classes)])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True))
    return model
"""


def run_two_workers(
    cwd: Path | Sequence[Path],
    logs: Path,
    timeout: float = 300,
    each: Sequence[dict[str, object]] = ({}, {}),
    **settings: object,
) -> list[tuple[int, str]]:
    """`fit` on 2 workers as scripts/launch-workers.sh starts them (STRATEGY=multi_worker, a TF_CONFIG each, on
    loopback ports) but forked from the test server, not new interpreters (the launcher's own tests are in
    tests/test_multi_worker.py): each worker's (exit code, output). `each`: settings of one worker alone; `cwd`:
    the workers' folder, or each one's (as two machines, where a relative path names each one's own file)."""
    from train.cluster.launch import free_ports, tf_configs

    folders = [cwd, cwd] if isinstance(cwd, Path) else list(cwd)
    processes, outputs = [], []
    for index, (config, own, folder) in enumerate(zip(tf_configs(free_ports(2)), each, folders, strict=True)):
        env = clean_env(**{"STRATEGY": "multi_worker", **settings, **own, "TF_CONFIG": config})
        outputs.append(logs / f"worker-{index}-{time.monotonic_ns()}.log")
        with open(outputs[-1], "wb") as stream:
            processes.append(start_python(["-m", "train", "fit"], cwd=folder, env=env, stdout=stream,
                                          stderr=subprocess.STDOUT))  # fmt: skip
    try:
        codes = [process.wait(timeout=timeout) for process in processes]
    finally:
        for process in processes:
            process.kill()
    return [(code, log.read_text()) for code, log in zip(codes, outputs, strict=True)]


def back_to(run: Path, step: int) -> None:
    """The run as if it had stopped at `step`: the checkpoints after it and the summary gone."""
    for path in (run / "checkpoints").glob("ckpt-*"):
        if int(path.name.split("-")[1].split(".")[0].split("_")[0]) > step:
            path.unlink()
    (run / "checkpoints" / "checkpoint").unlink()
    (run / "summary.json").unlink()


def moved_copy(straight: Path, moved: Path, step: int = 40) -> Path:
    """A copy of the uninterrupted run `straight`, as if it had stopped at `step`: the run to resume elsewhere."""
    shutil.copytree(straight, moved)
    back_to(moved, step)
    assert (moved / "checkpoints" / f"ckpt-{step}.index").is_file()
    return moved


RELATIVE_DIFFERENCE = """
import json, sys, numpy as np, keras
a, b = (keras.saving.load_model(path) for path in sys.argv[1:3])
x, y = (np.concatenate([w.ravel() for w in m.get_weights()]) for m in (a, b))
print(json.dumps(float(np.linalg.norm(x - y) / np.linalg.norm(x))))
"""


def relative_difference(first: Path, second: Path) -> float:
    """|a - b| / |a| over every weight of two runs' exports."""
    result = run_python(["-c", RELATIVE_DIFFERENCE, str(first / "model.keras"), str(second / "model.keras")])
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])
