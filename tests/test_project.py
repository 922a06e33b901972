"""The fork's own contract test: the project's MODEL, on the project's DATASET, as project/defaults.env (or
the template's defaults) resolve them. It needs no engine change and no data download, so `make test` passes
in a fork that swapped in its own model and dataset."""

from __future__ import annotations

import json
import os

from tests.conftest import REPO, run_python
from train.settings import FIELDS


def test_the_projects_model_builds_takes_a_training_step_on_its_datasets_spec_and_exports(tmp_path):
    env = {name: value for name, value in os.environ.items() if name not in {f.env for f in FIELDS}}
    env["PYTHONPATH"] = str(REPO)
    result = run_python(["-m", "tests.harness.contract", str(tmp_path / "export")], cwd=REPO, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["loss_finite"], outcome
    assert "loss" in outcome["metrics"]
    assert outcome["served_shape"][0] == 8  # one prediction per example
    assert outcome["saved_model"]


def test_a_fork_with_preprocess_builds_trains_a_step_and_serves_the_stored_features(tmp_path):
    """The same contract for a fork whose MODEL file defines preprocess (examples/resnet.py on synthetic_photos,
    images of their own size stored as JPEG): nothing prepared, the examples made from the dataset's features."""
    env = {name: value for name, value in os.environ.items() if name not in {f.env for f in FIELDS}}
    env.update(PYTHONPATH=str(REPO), MODEL="examples/resnet.py", DATASET="synthetic_photos",
               TFDS_DATA_DIR=str(tmp_path / "unprepared"))  # fmt: skip
    result = run_python(["-m", "tests.harness.contract", str(tmp_path / "export")], cwd=REPO, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["loss_finite"] and outcome["saved_model"], outcome
    assert outcome["served_shape"][0] == outcome["served_default_shape"][0] == 8


def test_a_text_fork_adapts_builds_trains_a_step_and_serves_its_strings(tmp_path):
    """A fork whose MODEL file adapts a TextVectorization (examples/text.py on synthetic_reviews, not prepared):
    the default signature takes the text as strings under its own name."""
    env = {name: value for name, value in os.environ.items() if name not in {f.env for f in FIELDS}}
    env.update(PYTHONPATH=str(REPO), MODEL="examples/text.py", DATASET="synthetic_reviews",
               TFDS_DATA_DIR=str(tmp_path / "unprepared"))  # fmt: skip
    result = run_python(["-m", "tests.harness.contract", str(tmp_path / "export")], cwd=REPO, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["loss_finite"] and outcome["saved_model"], outcome
    assert outcome["served_shape"][0] == outcome["served_default_shape"][0] == 8
