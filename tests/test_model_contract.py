"""MODEL: where build_model comes from, each way a model can break the contract (one line, exit 2, nothing
written), and a run directory that refuses a model other than its own."""

from __future__ import annotations

import json
import re

import pytest

from tests.conftest import REPO, clean_env, read_summary, run_python, run_train
from tests.harness.build_each import BUILD_EACH
from train.errors import SettingsError
from train.settings import load_settings

GOOD = (REPO / "examples" / "mlp.py").read_text()
BAD_MODELS = {
    "no_build_model": ("import keras\n", "has no build_model: define build_model(input_shape, num_classes, "),
    "raises": (
        "def build_model(input_shape, num_classes, learning_rate):\n    raise RuntimeError('no GPU budget today')\n",
        "build_model((32,), 10, 0.001) raised RuntimeError: no GPU budget today",
    ),
    "not_compiled": (
        "import keras\ndef build_model(input_shape, num_classes, learning_rate):\n"
        "    return keras.Sequential([keras.Input(input_shape), keras.layers.Dense(num_classes)])\n",
        "build_model returned a model that is not compiled: call model.compile(",
    ),
    "output_does_not_fit": (  # categorical cross-entropy wants one-hot labels; the dataset's are class numbers
        GOOD.replace('"sparse_categorical_crossentropy"', '"categorical_crossentropy"'),
        "does not fit the labels of synthetic_clusters/1.0.0 (LABEL_KEY='label': a class of 10)",
    ),
    "accumulates_gradients": (
        GOOD.replace("learning_rate=learning_rate)", "learning_rate=learning_rate, gradient_accumulation_steps=2)"),
        "compiles with gradient_accumulation_steps=2, which Keras cannot run inside a distributed training loop: "
        "set GLOBAL_BATCH_SIZE (the global batch) with BATCH_SIZE (what one replica takes at once) instead",
    ),
    "overwrites_with_ema": (
        GOOD.replace(
            "learning_rate=learning_rate)", "learning_rate=learning_rate, use_ema=True, ema_overwrite_frequency=10)"
        ),
        "compiles with use_ema and ema_overwrite_frequency=10, which Keras cannot run inside",
    ),
    "does_not_import": ("import not_a_module_anywhere\n", "could not be imported (ModuleNotFoundError: No module"),
}


def test_each_way_a_model_breaks_the_contract_is_one_line_naming_it(tmp_path, tfds_data_dir):
    """All of them built in one process, through the engine's `build` (what fit, evaluate and check call)."""
    paths = {}
    for name, (source, _) in BAD_MODELS.items():
        paths[name] = tmp_path / f"{name}.py"
        paths[name].write_text(source)
    result = run_python(["-c", BUILD_EACH, *map(str, paths.values())], cwd=tmp_path,
                        env=clean_env(TFDS_DATA_DIR=tfds_data_dir))  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    said = json.loads(result.stdout.strip().splitlines()[-1])
    for name, (_, expected) in BAD_MODELS.items():
        message = said[str(paths[name])]
        assert message is not None, name
        assert message.startswith(f"MODEL={str(paths[name])!r}"), message
        assert expected in message, (name, message)
        assert "\n" not in message


def test_a_bad_model_stops_fit_with_exit_2_before_the_run_directory_is_written(tmp_path, tfds_data_dir):
    (tmp_path / "broken.py").write_text(BAD_MODELS["output_does_not_fit"][0])
    result = run_train("fit", cwd=tmp_path, MODEL="broken.py", TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=tmp_path / "run")
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: MODEL='broken.py': its output (None, 10)")
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("missing.py", "MODEL='missing.py' is not a file (from "),
        ("models/missing", "MODEL='models/missing' is not a file (from "),
        ("no_such_package.model", "MODEL='no_such_package.model' is not an importable module"),
        ("not a module", "MODEL='not a module' is not an importable module"),
    ],
)
def test_a_model_that_cannot_be_found_is_refused_before_tensorflow(text, message, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SettingsError, match=f"^{re.escape(message)}"):
        load_settings({"MODEL": text}, environ={}, dotenv_path=tmp_path / ".env", defaults_path=None)


def test_model_names_a_file_by_path_and_a_module_by_name(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mine.py").write_text(GOOD)
    no_dotenv = "/nonexistent/.env"  # pytest's own working directory may hold a developer's .env
    assert load_settings({"MODEL": "mine.py"}, environ={}, dotenv_path=no_dotenv, defaults_path=None).model == "mine.py"
    chosen = load_settings({"MODEL": "examples.cnn"}, environ={}, dotenv_path=no_dotenv, defaults_path=None)
    assert chosen.model == "examples.cnn"


def test_a_run_refuses_another_model_in_one_line_and_resumes_through_a_comment_change(tmp_path, tfds_data_dir):
    model = tmp_path / "mine.py"
    model.write_text(GOOD)
    settings = {"MODEL": str(model), "TFDS_DATA_DIR": tfds_data_dir, "OUTPUT_DIR": tmp_path / "run",
                "STEPS_PER_EPOCH": 10, "EPOCHS": 1}  # fmt: skip
    assert run_train("fit", cwd=tmp_path, **settings).returncode == 0
    recorded = json.loads((tmp_path / "run" / "run.json").read_text())
    assert recorded["model"] == str(model) and len(recorded["model_sha256"]) == 64

    model.write_text(GOOD.replace("layers.Dense(64,", "layers.Dense(32,"))
    result = run_train("fit", cwd=tmp_path, fresh=True, **{**settings, "EPOCHS": 2})
    assert result.returncode == 2
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(
        f"error: MODEL={str(model)!r} is not the model OUTPUT_DIR={tmp_path / 'run'} was trained with"
    )
    assert "tensorflow" not in result.stderr.lower()  # refused before TensorFlow loads

    model.write_text("# a comment and a blank line change nothing\n\n" + GOOD)
    result = run_train("fit", cwd=tmp_path, **{**settings, "EPOCHS": 2})
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_summary(tmp_path / "run")["resumed_from_step"] == 10


def test_a_model_file_imports_the_modules_beside_it(tmp_path, tfds_data_dir):
    """As Python runs a script: `import head` finds head.py in the MODEL file's folder, at import and later, from
    another working directory."""
    (tmp_path / "models").mkdir()
    (tmp_path / "models" / "head.py").write_text(
        "import keras\ndef head(num_classes):\n    return keras.layers.Dense(num_classes, activation='softmax')\n"
    )
    (tmp_path / "models" / "model.py").write_text(
        "import keras\n"
        "import head\n"
        "def build_model(input_shape, num_classes, learning_rate):\n"
        "    from head import head as made  # a later import finds it too\n"
        "    model = keras.Sequential([keras.Input(input_shape), keras.layers.Dense(8), made(num_classes)])\n"
        "    model.compile(optimizer='adam', loss='sparse_categorical_crossentropy')\n"
        "    return model\n"
    )
    (tmp_path / "elsewhere").mkdir()
    result = run_train("fit", cwd=tmp_path / "elsewhere", MODEL=tmp_path / "models" / "model.py",
                       TFDS_DATA_DIR=tfds_data_dir, OUTPUT_DIR=tmp_path / "run", EPOCHS=1, STEPS_PER_EPOCH=2,
                       LOG_EVERY=1000)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_summary(tmp_path / "run")["steps"] == 2
