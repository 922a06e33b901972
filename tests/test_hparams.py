"""build_model's hyperparameters as settings (HP_<NAME>): typed by their defaults, resolved through the same layers
as every setting, refused in one line before TensorFlow loads. No TensorFlow here but in the one real process."""

from __future__ import annotations

import json
import subprocess
import sys
import time
import types

import pytest
from typer.testing import CliRunner

from tests.conftest import REPO, clean_env
from train.cli import app
from train.errors import SettingsError
from train.settings import agreed_settings, changed_settings, load_settings, read_run_settings

MODEL = """import keras

DROPOUT = 0.1  # a module constant may be a default


def build_model(input_shape, num_classes, learning_rate, *, width=64, dropout=DROPOUT, smooth=False,
                activation="relu", context):
    raise RuntimeError("not built here")
"""


@pytest.fixture
def model(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.py").write_text(MODEL)
    return "model.py"


def load(model, flags=None, environ=None, dotenv=None, project=None, tmp_path=None, warn=None):
    paths = {}
    for name, text in (("dotenv", dotenv), ("project", project)):
        paths[name] = tmp_path / f"{name}.env" if text is not None else None
        if text is not None:
            paths[name].write_text(text)
    return load_settings({"MODEL": model, **(flags or {})}, environ or {}, paths["dotenv"] or "/nonexistent/.env",
                         warn=warn, defaults_path=paths["project"])  # fmt: skip


def test_each_keyword_only_parameter_with_a_default_is_a_setting_typed_by_it(model):
    settings = load(model)
    assert settings.hyperparameters == (("width", 64), ("dropout", 0.1), ("smooth", False), ("activation", "relu"))
    assert {name: value for name, value in settings.to_json().items() if name.startswith("HP_")} == {
        "HP_WIDTH": "64", "HP_DROPOUT": "0.1", "HP_SMOOTH": "false", "HP_ACTIVATION": "relu",
    }  # fmt: skip
    typed = load(model, environ={"HP_WIDTH": "128", "HP_DROPOUT": "1e-2", "HP_SMOOTH": "yes", "HP_ACTIVATION": "gelu"})
    assert dict(typed.hyperparameters) == {"width": 128, "dropout": 0.01, "smooth": True, "activation": "gelu"}
    assert typed.typed()["HP_WIDTH"] == 128 and typed.typed()["HP_SMOOTH"] is True  # TensorBoard's HParams
    assert load(model, environ=typed.to_json()) == typed  # settings.json's text reads back to the same values


def test_a_flag_beats_the_environment_beats_dotenv_beats_project_defaults_beats_the_default(model, tmp_path):
    settings = load(
        model, flags={"HP_WIDTH": "8"}, environ={"HP_WIDTH": "16", "HP_DROPOUT": "0.2"},
        dotenv="HP_WIDTH=32\nHP_DROPOUT=0.3\nHP_ACTIVATION=tanh\n",
        project="HP_WIDTH=48\nHP_DROPOUT=0.4\nHP_ACTIVATION=elu\nHP_SMOOTH=true\n", tmp_path=tmp_path,
    )  # fmt: skip
    assert dict(settings.hyperparameters) == {"width": 8, "dropout": 0.2, "smooth": True, "activation": "tanh"}


@pytest.mark.parametrize(
    ("name", "value", "allowed"),
    [
        ("HP_WIDTH", "abc", "build_model's width is an int (its default is 64): use a whole number, like 64"),
        ("HP_WIDTH", "1.5", "is an int"),
        ("HP_DROPOUT", "lots", "build_model's dropout is a float (its default is 0.1): use a finite number"),
        ("HP_DROPOUT", "inf", "is a float"),
        ("HP_SMOOTH", "maybe", "build_model's smooth is a bool (its default is false): use true or false"),
    ],
)
def test_a_value_not_of_its_type_is_one_line_naming_the_setting_and_the_type(model, name, value, allowed):
    with pytest.raises(SettingsError) as caught:
        load(model, environ={name: value})
    assert str(caught.value).startswith(f"{name}={value!r} is not allowed: build_model's ")
    assert allowed in str(caught.value)
    assert "\n" not in str(caught.value)


def test_an_hp_name_build_model_does_not_declare_is_refused_naming_the_declared_ones(model, tmp_path):
    with pytest.raises(SettingsError) as caught:
        load(model, dotenv="HP_DEPTH=3\n", tmp_path=tmp_path)
    assert str(caught.value) == (
        f"HP_DEPTH (from {tmp_path / 'dotenv.env'}) is not a hyperparameter of MODEL='model.py': build_model declares "
        "HP_WIDTH (int, 64), HP_DROPOUT (float, 0.1), HP_SMOOTH (bool, false), HP_ACTIVATION (str, relu)"
    )
    with pytest.raises(SettingsError, match=r"^HP_WIDTH \(from the environment\) is not a hyperparameter of "
                                            r"MODEL='examples.mlp': build_model declares none"):  # fmt: skip
        load("examples.mlp", environ={"HP_WIDTH": "8"})


@pytest.mark.parametrize(
    ("signature", "message"),
    [
        ("*, width", "build_model's keyword-only parameter width has no default: give it one"),
        ("*, sizes=(64, 64)", "keyword-only parameter sizes=(64, 64) is a tuple, but a hyperparameter (HP_SIZES)"),
        ("*, width=None", "keyword-only parameter width=None is None, but a hyperparameter (HP_WIDTH) is typed"),
        ("*, act=keras.activations.relu", "act=keras.activations.relu is an expression, but a hyperparameter"),
        ("*, width=1, WIDTH=2", "build_model's width and WIDTH are both the setting HP_WIDTH: rename one"),
    ],
)
def test_a_keyword_only_parameter_that_cannot_be_a_setting_is_refused_before_tensorflow(tmp_path, signature, message):
    (tmp_path / "bad.py").write_text(f"import keras\n\n\ndef build_model(a, b, c, {signature}):\n    pass\n")
    with pytest.raises(SettingsError) as caught:
        load(str(tmp_path / "bad.py"))
    assert str(caught.value).startswith(f"MODEL={str(tmp_path / 'bad.py')!r}: ")
    assert message in str(caught.value)


def test_a_hyperparameter_defines_the_run_and_every_worker_must_agree_on_it(model, tmp_path):
    before = load(model, environ={"HP_DROPOUT": "0.1"})
    (tmp_path / "settings.json").write_text(json.dumps(before.to_json()))
    assert read_run_settings(tmp_path / "settings.json")[0]["HP_DROPOUT"] == "0.1"  # kept from the run's file
    now = load(model, environ={"HP_DROPOUT": "0.2"})
    assert changed_settings(tmp_path / "settings.json", now) == [("HP_DROPOUT", "0.1", "0.2")]
    assert agreed_settings(now)["HP_DROPOUT"] == "0.2" and agreed_settings(now)["HP_WIDTH"] == "64"


def test_evaluate_reads_a_runs_hyperparameters_from_its_settings_json(model, tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    (run / "settings.json").write_text(json.dumps({"MODEL": model, "HP_WIDTH": "96"}))
    settings = load_settings({"OUTPUT_DIR": str(run)}, {}, "/nonexistent/.env", defaults_path=None, from_run=True)
    assert dict(settings.hyperparameters)["width"] == 96


def test_a_bare_name_in_a_dotenv_file_is_said_to_be_the_hyperparameter(model, tmp_path):
    warnings: list[str] = []
    settings = load(model, project="WIDTH=128\n", tmp_path=tmp_path, warn=warnings.append)
    assert warnings == [
        f"{tmp_path / 'project.env'}: WIDTH is not a setting; did you mean HP_WIDTH (build_model's width)?"
    ]
    assert dict(settings.hyperparameters)["width"] == 64  # as warned: not set


runner = CliRunner()


def test_fit_help_lists_each_hyperparameter_of_the_model_with_its_type_and_default(model):
    result = runner.invoke(app, ["fit", "--help", "--model", model], env={"COLUMNS": "240"})
    assert result.exit_code == 0, result.output
    text = " ".join(result.output.split())
    assert "--hp-width INT build_model's width, an int (env: HP_WIDTH; default: 64)." in text
    assert "--hp-smooth true|false build_model's smooth, a bool (env: HP_SMOOTH; default: false)." in text
    assert "--hp-context" not in text  # the run's facts, not a setting
    plain = runner.invoke(app, ["fit", "--help", "--model", "examples.mlp"], env={"COLUMNS": "240"})
    assert "--hp-" not in plain.output


def test_hp_flags_reach_the_settings_and_an_unknown_one_is_one_line(model, monkeypatch):
    got = {}
    monkeypatch.setitem(sys.modules, "train.fit", types.SimpleNamespace(fit=lambda s, stop, **_: got.update(s=s) or {
        "interrupted": False}))  # fmt: skip
    monkeypatch.setattr("train.rundir.preflight", lambda *args: None)
    monkeypatch.setattr("train.cli._load_tensorflow", lambda: None)  # no TensorFlow in pytest's process
    env = {**clean_env(), "COLUMNS": "200"}
    result = runner.invoke(app, ["fit", "--model", model, "--hp-width", "128", "--hp-smooth=true"], env=env)
    assert result.exit_code == 0, result.output
    assert dict(got["s"].hyperparameters)["width"] == 128 and dict(got["s"].hyperparameters)["smooth"] is True
    result = runner.invoke(app, ["fit", "--model", model, "--hp-depth", "3"], env=env)
    assert result.exit_code == 2
    assert result.output.strip().splitlines() == [
        "error: HP_DEPTH (from a flag) is not a hyperparameter of MODEL='model.py': build_model declares HP_WIDTH "
        "(int, 64), HP_DROPOUT (float, 0.1), HP_SMOOTH (bool, false), HP_ACTIVATION (str, relu)"
    ]


@pytest.mark.parametrize("given", [{"HP_WIDTH": "abc"}, {"HP_DEPTH": "3"}], ids=["bad value", "undeclared"])
def test_a_bad_hyperparameter_stops_fit_in_seconds_before_tensorflow_and_writes_nothing(tmp_path, given):
    (tmp_path / "model.py").write_text(MODEL)
    started = time.monotonic()
    result = subprocess.run(
        [sys.executable, "-m", "train", "fit"], cwd=tmp_path, capture_output=True, text=True, timeout=60,
        env=clean_env(MODEL="model.py", OUTPUT_DIR=tmp_path / "run", **given),
    )  # fmt: skip
    took = time.monotonic() - started
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"error: {next(iter(given))}"), result.stderr
    assert "tensorflow" not in result.stderr.lower() and not result.stdout
    assert not (tmp_path / "run").exists()
    print(f"refused in {took:.2f} s")  # a timing is printed, not asserted; no TensorFlow line above says it came first


def test_make_passes_hyperparameters_through_to_the_command_and_the_container():
    result = subprocess.run(
        ["make", "--no-print-directory", "--eval", 'show-hp: ; @echo "[$$HP_WIDTH]"', "show-hp", "HP_WIDTH=128"],
        cwd=REPO, capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[128]"
    docker = subprocess.run(["make", "-s", "-n", "--no-print-directory", "docker-train", "HP_WIDTH=128"], cwd=REPO,
                            capture_output=True, text=True, timeout=60)  # fmt: skip
    assert docker.returncode == 0, docker.stderr
    assert " -e HP_WIDTH " in docker.stdout  # by name: its value from make's environment
