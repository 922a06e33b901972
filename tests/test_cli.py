"""The CLI wiring, through typer's CliRunner and as a real subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import types

import pytest
from typer.testing import CliRunner

from tests.conftest import clean_env, engine_defaults
from train.cli import app
from train.settings import ENVIRONMENT_TYPO_CUTOFF, FIELDS, likely_typos

runner = CliRunner()


@pytest.fixture
def fake_training(monkeypatch):
    """Fakes `train.fit` (the TensorFlow library the commands call) to capture what they pass it."""
    calls = {}

    def fit(settings, stop, **options):
        calls["fit"] = settings
        return {"interrupted": calls.get("interrupt", False)}

    monkeypatch.setitem(sys.modules, "train.fit", types.SimpleNamespace(fit=fit))
    return calls


def invoke(args, env=None, tmp_path=None, monkeypatch=None):
    if monkeypatch is not None:
        monkeypatch.chdir(tmp_path)  # no stray .env
        for name in [field.env for field in FIELDS] + list(likely_typos(os.environ, ENVIRONMENT_TYPO_CUTOFF)):
            monkeypatch.delenv(name, raising=False)
    return runner.invoke(app, args, env={"COLUMNS": "200", **engine_defaults(), **(env or {})})


def test_fit_help_shows_every_flag_with_its_environment_variable():
    result = runner.invoke(app, ["fit", "--help"], env={"COLUMNS": "240"})
    assert result.exit_code == 0
    text = " ".join(result.output.split())  # as read, whatever the terminal's width wrapped
    for field in FIELDS:
        assert field.flag in text
        assert f"env: {field.env}" in text
    assert "<str>" not in result.output  # each setting shows the form of its value: N, true|false, PATH, ...
    assert "FILE|MODULE" in result.output and "all|none|0,1" in result.output and "START-END" in result.output


@pytest.mark.parametrize("command", ["predict", "evaluate"])
def test_predict_and_evaluate_help_list_only_the_settings_they_read(command):
    result = runner.invoke(app, [command, "--help"], env={"COLUMNS": "240"})
    assert result.exit_code == 0
    text = " ".join(result.output.split())
    for flag in ("--output-dir", "--dataset", "--eval-split", "--batch-size", "--gpus", "--model"):
        assert flag in text, flag
    for flag in ("--epochs", "--learning-rate", "--monitor", "--init-from", "--resume", "--tracking"):
        assert f"{flag} " not in text, flag  # training's alone: the run's settings.json has them


def test_predict_takes_the_settings_it_reads_and_refuses_a_training_one(tmp_path, monkeypatch):
    import typer

    seen = {}

    def check_run(settings, checkpoint):
        seen["settings"] = settings
        raise typer.Exit(0)

    monkeypatch.setattr("train.predict.check_run", check_run)
    args = ["predict", "--output-dir", "run", "--eval-split", "valid", "--batch-size", "8", "--gpus", "none", "a.csv"]
    result = invoke(args, None, tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output
    settings = seen["settings"]
    assert (settings.eval_split, settings.batch_size, settings.gpus) == ("valid", 8, "none")
    refused = invoke(["predict", "--epochs", "3", "a.csv"], None, tmp_path, monkeypatch)
    assert refused.exit_code == 2 and "No such option: --epochs" in refused.output


def test_fit_gets_settings_resolved_from_flag_environment_and_dotenv(fake_training, tmp_path, monkeypatch):
    (tmp_path / ".env").write_text("SEED=7\nEPOCHS=9\n")
    result = invoke(["fit", "--epochs", "3", "--gpus", "none"], {"BATCH_SIZE": "16"}, tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output
    settings = fake_training["fit"]
    assert (settings.epochs, settings.gpus, settings.batch_size, settings.seed) == (3, "none", 16, 7)


def test_bad_flag_is_one_line_exit_2_and_training_never_starts(fake_training, tmp_path, monkeypatch):
    result = invoke(["fit", "--batch-size", "0"], None, tmp_path, monkeypatch)
    assert result.exit_code == 2
    assert result.output.strip() == "error: BATCH_SIZE='0' is not allowed: use a whole number of 1 or more"
    assert "fit" not in fake_training
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_interrupted_run_exits_with_the_restart_code(fake_training, tmp_path, monkeypatch):
    fake_training["interrupt"] = True
    result = invoke(["fit"], None, tmp_path, monkeypatch)
    assert result.exit_code == 42


def test_help_and_validation_do_not_import_tensorflow(tmp_path):
    script = (
        "import sys\n"
        "from typer.testing import CliRunner\n"
        "from train.cli import app\n"
        "CliRunner().invoke(app, ['fit', '--help'])\n"
        "result = CliRunner().invoke(app, ['fit', '--epochs', 'x'])\n"
        "assert result.exit_code == 2, result.output\n"
        "CliRunner().invoke(app, ['predict', '--help'])\n"
        "result = CliRunner().invoke(app, ['predict', '--output-dir', 'nowhere', 'rows.csv'])\n"
        "assert result.exit_code == 2, result.output\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('tensorflow', 'keras', 'tensorflow_datasets')))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script], cwd=tmp_path, env=clean_env(), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


def test_bad_environment_value_in_a_real_process_is_one_line_without_traceback(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "train", "fit"],
        cwd=tmp_path,
        env=clean_env(GPUS="0,0", OUTPUT_DIR=str(tmp_path / "run")),
        capture_output=True,
        text=True,
    )
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        "error: GPUS='0,0' names a GPU twice: use all, none, or distinct GPU indices without spaces, like 0 or 0,1"
    ]
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("target", ["missing/result.json", "."])
def test_unwritable_json_path_is_refused_before_any_work(target, tmp_path, monkeypatch):
    """A fake `train.tools.check.check` records whether the trial run started: it must not."""
    started = []
    module = types.SimpleNamespace(check=lambda settings, **options: started.append(settings))
    monkeypatch.setitem(sys.modules, "train.tools.check", module)
    result = invoke(["check", "--json", target], {}, tmp_path, monkeypatch)
    assert result.exit_code == 2
    assert result.output.startswith(f"error: --json {target}")
    assert len(result.output.strip().splitlines()) == 1
    assert started == []


def test_check_writes_its_json_result_whole(tmp_path, monkeypatch):
    """A fake `train.tools.check.check` returns a fixed result: what is tested is the writing of it."""
    result_of_check = {"table": "the table", "recommended_batch_size": 64}
    module = types.SimpleNamespace(check=lambda settings, **options: dict(result_of_check))
    monkeypatch.setitem(sys.modules, "train.tools.check", module)
    result = invoke(["check", "--json", "out.json"], {}, tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output
    assert "the table" in result.output
    assert json.loads((tmp_path / "out.json").read_text()) == {"recommended_batch_size": 64}
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]  # no temporary file left


def test_check_json_through_a_symlink_writes_its_target(tmp_path, monkeypatch):
    """A fake `train.tools.check.check` returns a fixed result: what is tested is where it is written."""
    module = types.SimpleNamespace(check=lambda settings, **options: {"table": "", "recommended_batch_size": 8})
    monkeypatch.setitem(sys.modules, "train.tools.check", module)
    (tmp_path / "results").mkdir()
    (tmp_path / "latest.json").symlink_to(tmp_path / "results" / "run1.json")
    result = invoke(["check", "--json", "latest.json"], {}, tmp_path, monkeypatch)
    assert result.exit_code == 0, result.output
    assert (tmp_path / "latest.json").is_symlink()
    assert json.loads((tmp_path / "results" / "run1.json").read_text()) == {"recommended_batch_size": 8}
