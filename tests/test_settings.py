"""Settings: precedence, parsing and the one-line errors. No TensorFlow here."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import clean_env, run_python
from train.errors import SettingsError
from train.settings import FIELDS, load_settings, read_dotenv

REPO = Path(__file__).resolve().parents[1]


def load(flags=None, environ=None, dotenv_text=None, tmp_path: Path | None = None, warn=None):
    dotenv = Path("/nonexistent/.env")
    if dotenv_text is not None:
        dotenv = tmp_path / ".env"
        dotenv.write_text(dotenv_text)
    return load_settings(flags or {}, environ or {}, dotenv, warn=warn, defaults_path=None)


def test_defaults_when_nothing_is_set():
    settings = load()
    assert settings.gpus == "all"
    assert settings.memory_growth is True
    assert settings.gpu_memory_limit_mb is None
    assert settings.strategy == "auto"
    assert settings.dataset == "synthetic_clusters"
    assert settings.steps_per_epoch is None
    assert settings.output_dir == Path("runs/default")


def test_flag_beats_environment_beats_dotenv_beats_default(tmp_path):
    settings = load(
        flags={"EPOCHS": "4"},
        environ={"EPOCHS": "3", "BATCH_SIZE": "32"},
        dotenv_text="EPOCHS=2\nBATCH_SIZE=16\nSEED=7\n",
        tmp_path=tmp_path,
    )
    assert settings.epochs == 4  # flag
    assert settings.batch_size == 32  # environment over .env
    assert settings.seed == 7  # .env over default
    assert settings.learning_rate == 0.001  # default


def test_empty_flag_value_is_not_the_same_as_unset():
    assert load(flags={"GPUS": None}).gpus == "all"
    with pytest.raises(SettingsError, match=r"^GPUS=''.*; or leave GPUS out for its default, all$"):
        load(flags={"GPUS": ""})


def test_a_setting_set_empty_in_the_environment_is_unset(tmp_path):
    """`docker run -e TFDS_DATA_DIR=`, `GPUS= make train`: the layers below decide, as if it were not there."""
    assert load(environ={"GPUS": "", "TFDS_DATA_DIR": "", "OUTPUT_DIR": ""}).gpus == "all"
    settings = load(environ={"GPUS": "", "EPOCHS": ""}, dotenv_text="GPUS=1\nEPOCHS=3\n", tmp_path=tmp_path)
    assert (settings.gpus, settings.epochs, settings.tfds_data_dir) == ((1,), 3, None)


def test_empty_value_means_unset_where_the_default_is_empty():
    assert load(environ={"GPU_MEMORY_LIMIT_MB": "", "TFDS_DATA_DIR": ""}).gpu_memory_limit_mb is None


def test_gpus_forms():
    assert load(environ={"GPUS": "none"}).gpus == "none"
    assert load(environ={"GPUS": "1"}).gpus == (1,)
    assert load(environ={"GPUS": "0,2"}).gpus == (0, 2)


@pytest.mark.parametrize(
    ("name", "value", "allowed"),
    [
        ("GPUS", "0,0", "names a GPU twice"),
        ("GPUS", "-1", "distinct GPU indices"),
        ("GPUS", "a", "distinct GPU indices"),
        ("GPUS", "", "distinct GPU indices"),
        ("GPUS", "0, 1", "without spaces"),
        ("GPUS", " ", "distinct GPU indices"),
        ("MEMORY_GROWTH", "maybe", "true or false"),
        ("BATCH_SIZE", "0", "1 or more"),
        ("BATCH_SIZE", "-8", "1 or more"),
        ("BATCH_SIZE", "many", "1 or more"),
        ("EPOCHS", "1.5", "1 or more"),
        ("STEPS_PER_EPOCH", "0", "1 or more"),
        ("CHECKPOINT_EVERY", "x", "1 or more"),
        ("KEEP_CHECKPOINTS", "0", "1 or more"),
        ("CPU_DEVICES", "0", "1 or more"),
        ("LEARNING_RATE", "0", "greater than 0"),
        ("LEARNING_RATE", "-0.1", "greater than 0"),
        ("LEARNING_RATE", "nan", "greater than 0"),
        ("STRATEGY", "tpu", "auto, one_device, mirrored"),
        ("RESUME", "always", "auto, never"),
        ("DATASET", "MNIST!", "TFDS dataset name"),
        ("SEED", "-1", "0 or more"),
        ("OUTPUT_DIR", "", "non-empty"),
        ("DATA_IN_MEMORY", "yes", "auto, true, false"),
        ("JIT_COMPILE", "xla", "auto, true, false"),
    ],
)
def test_bad_value_is_one_line_naming_setting_value_and_what_is_allowed(name, value, allowed):
    with pytest.raises(SettingsError) as caught:
        load(flags={name: value}) if value == "" else load(environ={name: value})  # empty in the environment: unset
    message = str(caught.value)
    assert "\n" not in message
    assert message.startswith(f"{name}={value!r}")
    assert allowed in message


def test_tracking_with_mlflow_not_installed_is_refused_in_one_line_before_tensorflow(monkeypatch):
    """TRACKING=mlflow without the track extra: `import mlflow` fails (None in sys.modules), and so does the look
    it is read through (importlib.util.find_spec), as where mlflow is not installed."""
    assert load().tracking == "none"
    monkeypatch.setitem(sys.modules, "mlflow", None)
    with pytest.raises(SettingsError) as refused:
        load(environ={"TRACKING": "mlflow"})
    assert str(refused.value) == (
        "TRACKING=mlflow needs mlflow, which is not installed: make setup EXTRAS=dev,track (the track extra), or "
        "use TRACKING=none"
    )


def test_tracking_with_mlflow_not_installed_exits_2_with_one_line(tmp_path):
    """The command line: exit 2, one line on stderr, no traceback, TensorFlow not loaded (a fresh interpreter where
    `import mlflow` fails)."""
    code = (
        "import atexit, runpy, sys; sys.modules['mlflow'] = None; "
        "atexit.register(lambda: print('tensorflow loaded' if 'tensorflow' in sys.modules else 'no tensorflow')); "
        "runpy.run_module('train', run_name='__main__')"
    )
    done = run_python(["-c", code, "fit"], cwd=tmp_path, env=clean_env(TRACKING="mlflow"), fresh=True, timeout=120)
    assert (done.returncode, done.stdout) == (2, "no tensorflow\n"), done.stderr
    assert done.stderr.strip().splitlines() == [
        "error: TRACKING=mlflow needs mlflow, which is not installed: make setup EXTRAS=dev,track (the track extra), "
        "or use TRACKING=none"
    ]


def test_memory_cap_with_memory_growth_is_an_error():
    with pytest.raises(SettingsError, match="GPU_MEMORY_LIMIT_MB=4096 cannot be combined with MEMORY_GROWTH=true"):
        load(environ={"GPU_MEMORY_LIMIT_MB": "4096"})
    settings = load(environ={"GPU_MEMORY_LIMIT_MB": "4096", "MEMORY_GROWTH": "false"})
    assert settings.gpu_memory_limit_mb == 4096


@pytest.mark.parametrize("environ", [{"STRATEGY": "mirrored", "GPUS": "none"}, {"CPU_DEVICES": "2", "GPUS": "none"}])
def test_xla_of_a_step_mirrored_on_cpu_devices_is_refused_before_tensorflow(environ):
    with pytest.raises(SettingsError, match=r"^JIT_COMPILE=true is not allowed with MirroredStrategy on CPU devices"):
        load(environ={**environ, "JIT_COMPILE": "true"})
    assert load(environ={**environ, "JIT_COMPILE": "auto"}).jit_compile == "auto"


def test_xla_with_a_streamed_split_is_allowed_it_compiles_the_replica_step():
    assert load(environ={"JIT_COMPILE": "true", "DATA_IN_MEMORY": "false"}).jit_compile == "true"


def test_malformed_dotenv_line_is_refused_with_file_and_line(tmp_path):
    with pytest.raises(SettingsError, match=r"\.env:2: cannot read 'BATCH_SIZE 64'"):
        load(dotenv_text="EPOCHS=2\nBATCH_SIZE 64\n", tmp_path=tmp_path)


def test_dotenv_typo_of_a_setting_is_warned(tmp_path):
    warnings: list[str] = []
    load(dotenv_text="BATCHSIZE=64\nEPOCS=2\nMY_OWN_VAR=1\n", tmp_path=tmp_path, warn=warnings.append)
    assert any("BATCHSIZE is not a setting; did you mean BATCH_SIZE?" in w for w in warnings)
    assert any("EPOCS is not a setting; did you mean EPOCHS?" in w for w in warnings)
    assert not any("MY_OWN_VAR" in w for w in warnings)


def test_dotenv_setting_set_twice_keeps_the_last_value_and_says_so(tmp_path):
    warnings: list[str] = []
    settings = load(dotenv_text="EPOCHS=5\nSEED=1\nEPOCHS=3\nSEED=1\n", tmp_path=tmp_path, warn=warnings.append)
    assert settings.epochs == 3
    assert warnings == [f"{tmp_path / '.env'}:3: EPOCHS='3' sets EPOCHS again (line 1: '5'); the last one counts"]


def test_environment_typo_of_a_setting_is_warned():
    """`make train EPOCH=3` exports EPOCH to the CLI's environment: it is named, not silently ignored."""
    warnings: list[str] = []
    settings = load(environ={"EPOCH": "3", "HOME": "/root", "TF_CPP_MIN_LOG_LEVEL": "2"}, warn=warnings.append)
    assert warnings == ["environment (or make variable): EPOCH is not a setting; did you mean EPOCHS?"]
    assert settings.epochs == 5  # the default, as warned


def test_resolved_settings_round_trip_through_their_json(tmp_path):
    settings = load(environ={"GPUS": "0,1", "STEPS_PER_EPOCH": "10", "MEMORY_GROWTH": "no"})
    assert load(environ=settings.to_json()) == settings


def test_the_settings_have_every_one_the_data_reads():
    """data/ declares what it reads of the settings (DataSettings) without importing them: the run's Settings has
    each, so that a setting renamed in the table fails here, not in a run."""
    from train.data.data_settings import DataSettings

    settings = load()
    assert isinstance(settings, DataSettings)
    assert isinstance(settings.replace(train_split="train[:90%]"), DataSettings)


def test_env_example_documents_every_setting_with_its_default():
    example = read_dotenv(REPO / ".env.example")
    assert example == {field.env: field.default for field in FIELDS}
    text = (REPO / ".env.example").read_text()
    for field in FIELDS:
        # each setting has a comment line right above it
        assert re.search(rf"^# .+\n{field.env}=", text, re.MULTILINE), field.env


def test_the_makefile_docker_mk_and_docker_tests_read_every_setting_from_the_table():
    """The Makefile, docker/docker.mk and scripts/test-docker-common.sh list the settings with one `sed` over
    train/settings/table.py (lines `    name: type = setting(`): it must find every setting however ruff lays the
    table out."""
    expressions = set()
    for name in ("Makefile", "docker/docker.mk", "scripts/test-docker-common.sh"):
        found = re.findall(r"sed -n '(/\^class Settings/[^']*)'", (REPO / name).read_text())
        assert found, name
        expressions.update(found)
    for expression in expressions:
        listed = subprocess.run(
            ["sed", "-n", expression, "train/settings/table.py"], cwd=REPO, capture_output=True, text=True, check=True
        ).stdout.split()
        assert listed == [field.attr for field in FIELDS]


def test_evaluate_takes_the_runs_settings_under_flags_and_the_environment_and_over_dotenv(tmp_path):
    """flag > environment > the run's settings.json > .env > default (load_settings(from_run=True): evaluate's)."""
    run = tmp_path / "run"
    run.mkdir()
    recorded = {"DATASET": "from_run", "EVAL_SPLIT": "from_run", "TRAIN_SPLIT": "from_run", "BATCH_SIZE": "64"}
    (run / "settings.json").write_text(json.dumps(recorded))
    dotenv = tmp_path / ".env"
    dotenv.write_text(f"OUTPUT_DIR={run}\nDATASET=from_dotenv\nEVAL_SPLIT=from_dotenv\nBATCH_SIZE=32\nSEED=7\n")
    settings = load_settings(
        {"DATASET": "from_flag"}, {"EVAL_SPLIT": "from_env"}, dotenv, defaults_path=None, from_run=True
    )
    assert (settings.dataset, settings.eval_split, settings.train_split) == ("from_flag", "from_env", "from_run")
    assert settings.batch_size == 64  # the run's, over .env's 32
    assert settings.seed == 7  # the run does not record it: .env's
    assert load_settings({}, {}, dotenv, defaults_path=None).dataset == "from_dotenv"  # without the run's layer


def test_fit_on_a_run_takes_what_defines_it_from_its_settings_and_the_machines_settings_from_this_host(tmp_path):
    """load_settings(from_run="defining"), fit's: MODEL, DATASET, the batch, EPOCHS from the run's settings.json;
    GPUS, CPU_DEVICES, STRATEGY from this host; a .env value the run overrides said in one warning line."""
    run = tmp_path / "run"
    run.mkdir()
    recorded = {
        "MODEL": "examples.cnn",
        "DATASET": "synthetic_images",
        "BATCH_SIZE": "32",
        "EPOCHS": "4",
        "LEARNING_RATE": "0.01",
        "GPUS": "1",
        "CPU_DEVICES": "2",
        "STRATEGY": "mirrored",
        "RESUME": "never",
    }
    (run / "settings.json").write_text(json.dumps(recorded))
    dotenv = tmp_path / ".env"
    dotenv.write_text("BATCH_SIZE=64\nCPU_DEVICES=3\nSEED=7\n")
    warnings: list[str] = []
    settings = load_settings({"OUTPUT_DIR": str(run)}, {"EPOCHS": "6"}, dotenv, warn=warnings.append,
                             defaults_path=None, from_run="defining")  # fmt: skip
    assert (settings.model, settings.dataset, settings.batch_size) == ("examples.cnn", "synthetic_images", 32)
    assert (settings.epochs, settings.learning_rate, settings.seed) == (6, 0.01, 7)  # the environment's EPOCHS
    assert (settings.gpus, settings.cpu_devices, settings.strategy, settings.resume) == ("all", 3, "auto", "auto")
    [line] = [line for line in warnings if "BATCH_SIZE" in line]
    assert f"{dotenv}'s BATCH_SIZE='64'" in line and "the run's value counts" in line
    assert len(warnings) == 1, warnings
    fresh = load_settings({"OUTPUT_DIR": str(tmp_path / "new")}, {}, dotenv, defaults_path=None, from_run="defining")
    assert (fresh.batch_size, fresh.model) == (64, "examples.mlp")  # a new run: nothing to take


def test_batch_size_and_global_batch_size_each_come_from_their_own_highest_layer_and_say_where(tmp_path):
    """A fork's project/defaults.env BATCH_SIZE (what fits its GPU) with a flag's GLOBAL_BATCH_SIZE (what the recipe
    needs): both kept, so the step accumulates (train.batches.batch_plan); one layer may set both."""
    defaults = tmp_path / "defaults.env"
    defaults.write_text("BATCH_SIZE=64\n")
    none = tmp_path / "none"
    chosen = load_settings({"GLOBAL_BATCH_SIZE": "512"}, environ={}, dotenv_path=none, defaults_path=defaults)
    assert (chosen.batch_size, chosen.global_batch_size) == (64, 512)
    assert chosen.batch_from == (("BATCH_SIZE", str(defaults)), ("GLOBAL_BATCH_SIZE", "a flag"))
    chosen = load_settings({"BATCH_SIZE": "32"}, environ={"GLOBAL_BATCH_SIZE": "512"}, dotenv_path=none)
    assert (chosen.batch_size, chosen.global_batch_size) == (32, 512)
    chosen = load_settings(environ={"GLOBAL_BATCH_SIZE": "512", "BATCH_SIZE": "64"}, dotenv_path=none)
    assert (chosen.batch_size, chosen.global_batch_size) == (64, 512)
    chosen = load_settings({"BATCH_SIZE": ""}, environ={"GLOBAL_BATCH_SIZE": "512"}, dotenv_path=none)
    assert (chosen.batch_size, chosen.global_batch_size) == (None, 512)  # alone: the global batch / the replicas
    chosen = load_settings({}, environ={}, dotenv_path=none, defaults_path=None)
    assert (chosen.batch_size, chosen.batch_from) == (128, (("BATCH_SIZE", "the default"),))


def test_of_two_bad_values_the_first_in_the_table_is_told_dataset_included(tmp_path):
    """DATASET's kind is decided while the settings are read (Settings.source), in the table's order: a path that
    does not exist is told before a bad value of a later setting, as every other setting's is."""
    missing = str(tmp_path / "no-such-folder")
    with pytest.raises(SettingsError, match=r"^DATASET='.*no-such-folder' does not exist"):
        load(environ={"DATASET": missing, "EPOCHS": "many"})
    with pytest.raises(SettingsError, match=r"^DATASET='no such name' is not allowed"):
        load(environ={"DATASET": "no such name", "EPOCHS": "many"})


def test_model_and_dataset_paths_are_written_absolute_and_names_as_given(tmp_path, monkeypatch):
    """settings.json (to_json) holds MODEL's and DATASET's paths absolute: `--output-dir RUN` works from anywhere."""
    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.py").write_text("def build_model(input_shape, num_classes, learning_rate): ...\n")
    (tmp_path / "rows.csv").write_text("a,label\n1,0\n2,1\n")
    text = load_settings(environ={"MODEL": "model.py", "DATASET": "rows.csv"}, dotenv_path=tmp_path / ".env").to_json()
    assert (text["MODEL"], text["DATASET"]) == (str(tmp_path / "model.py"), str(tmp_path / "rows.csv"))
    names = load_settings(environ={"MODEL": "examples.cnn", "DATASET": "mnist"}, dotenv_path=tmp_path / ".env")
    assert (names.to_json()["MODEL"], names.to_json()["DATASET"]) == ("examples.cnn", "mnist")


def test_a_path_a_run_recorded_relative_is_not_a_changed_setting_now_it_is_written_absolute(tmp_path, monkeypatch):
    from train.settings.layers import changed_settings

    monkeypatch.chdir(tmp_path)
    (tmp_path / "model.py").write_text("def build_model(input_shape, num_classes, learning_rate): ...\n")
    (tmp_path / "rows.csv").write_text("a,label\n1,0\n2,1\n")
    settings = load_settings(environ={"MODEL": "model.py", "DATASET": "rows.csv"}, dotenv_path=tmp_path / ".env")
    (tmp_path / "settings.json").write_text(json.dumps({**settings.to_json(), "MODEL": "model.py", "SEED": "7"}))
    assert changed_settings(tmp_path / "settings.json", settings) == [("SEED", "7", settings.to_json()["SEED"])]
