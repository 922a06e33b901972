"""A first run as a new user sees it, in a fresh interpreter on CPU: no alarming line from CUDA's start-up where
there is no GPU driver, no progress bars' escape codes in a log, the model's table once, and a resume that names
the model in one line."""

from __future__ import annotations

from tests.conftest import run_train

SETTINGS = {"EPOCHS": 1, "TRAIN_SPLIT": "train[:256]", "EVAL_SPLIT": "test[:64]", "BATCH_SIZE": 64}


def test_a_first_run_prepares_trains_and_resumes_without_alarming_lines(tmp_path):
    settings = {**SETTINGS, "TFDS_DATA_DIR": tmp_path / "data", "OUTPUT_DIR": tmp_path / "run"}  # prepared anew
    first = run_train("fit", cwd=tmp_path, fresh=True, **settings)  # fresh: TensorFlow's start-up lines as printed
    assert first.returncode == 0, first.stderr[-3000:]
    assert "cuInit" not in first.stderr, first.stderr
    if "Could not find cuda drivers" in first.stderr:  # TensorFlow found no driver: a CPU machine, and it says so
        assert "No GPU found: training on CPU." in first.stdout
    assert "\x1b[" not in first.stdout + first.stderr  # TFDS's bars (its "[A") are off where stderr is no terminal
    assert "Total params: 2,762" in first.stdout  # the model's table at the first start

    resumed = run_train("fit", cwd=tmp_path, **{**settings, "EPOCHS": 2})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    assert "Total params" not in resumed.stdout
    assert "Model classifier_serving: 2,762 parameters." in resumed.stdout.splitlines()
