"""The fork's own contract test: the project's MODEL, on the project's DATASET, as project/defaults.env (or
the template's defaults) resolve them. It needs no engine change and no data download, so `make test` passes
in a fork that swapped in its own model and dataset; where it fails, the engine's one line is the first of the
failure."""

from __future__ import annotations

from tests.harness.contract_run import failure, outcome, run_contract


def test_the_projects_model_builds_takes_a_training_step_on_its_datasets_spec_and_exports(tmp_path):
    result = run_contract(tmp_path / "export")
    assert result.returncode == 0, failure(result)
    found = outcome(result)
    assert found["loss_finite"], found
    assert "loss" in found["metrics"]
    assert found["served_shape"][0] == found["served_default_shape"][0] == 8  # one prediction per example
    assert found["saved_model"]


def test_a_fork_with_preprocess_builds_trains_a_step_and_serves_the_stored_features(tmp_path):
    """The same contract for a fork whose MODEL file defines preprocess (examples/resnet.py on synthetic_photos,
    images of their own size stored as JPEG): nothing prepared, the examples made from the dataset's features."""
    result = run_contract(tmp_path / "export", MODEL="examples/resnet.py", DATASET="synthetic_photos",
                          TFDS_DATA_DIR=str(tmp_path / "unprepared"))  # fmt: skip
    assert result.returncode == 0, failure(result)
    found = outcome(result)
    assert found["loss_finite"] and found["saved_model"], found
    assert found["served_shape"][0] == found["served_default_shape"][0] == 8
    assert found["served_outputs"] == ["classes", "scores"]


def test_a_text_fork_adapts_builds_trains_a_step_and_serves_its_strings(tmp_path):
    """A fork whose MODEL file adapts a TextVectorization (examples/text.py on synthetic_reviews, not prepared):
    the default signature takes the text as strings under its own name."""
    result = run_contract(tmp_path / "export", MODEL="examples/text.py", DATASET="synthetic_reviews",
                          TFDS_DATA_DIR=str(tmp_path / "unprepared"))  # fmt: skip
    assert result.returncode == 0, failure(result)
    found = outcome(result)
    assert found["loss_finite"] and found["saved_model"], found
    assert found["served_shape"][0] == found["served_default_shape"][0] == 8
