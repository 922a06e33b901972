"""The matrix: each kind of DATASET a user brings, through each command that reaches it (issue 41).

Kinds: a TFDS name (run from its own data directory, TFDS_DATA_DIR set empty: TFDS's default), an image folder
with one split, an image folder with train/ and test/, a CSV with empty cells and a text column (the default
model), a JSON Lines file of texts; and a table whose label is a value, as a CSV and as JSON Lines (the default
model's regression head, issue 58: its CSV's fit in the fast tier, every other cell of the two slow). Each is
trained once (a module fixture per kind), then: `fit --output-dir RUN --epochs 2` with nothing else (the run's
own settings; 2 replicas from this host's CPU_DEVICES), `evaluate`, `predict` on files and `--split` (one call),
a changed source refused by fit, evaluate and `predict --split`; a new run started from the kind's run
(INIT_FROM) with a phase boundary (FREEZE, UNFREEZE_AT_EPOCH, issue 45), evaluated and predicting, on one device
and on 2 workers (slow). Each asserts the exit code, that no traceback was printed, and what was written.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import clean_env, needs, read_summary, run_python
from tests.harness.runs import run_two_workers
from tests.test_local_data import photos

RESIZED = """
import keras, tensorflow as tf
def preprocess(example, training, seed):
    return tf.image.resize(example["image"], (8, 8)) / 255, example["label"]
def build_model(input_shape, num_classes, learning_rate):
    model = keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(), keras.layers.Dense(8),
                              keras.layers.Dense(num_classes)])
    model.compile(optimizer="sgd", loss=keras.losses.SparseCategoricalCrossentropy(from_logits=True),
                  metrics=["accuracy"])
    return model
"""
FAST = {"EPOCHS": 1, "BATCH_SIZE": 8, "LOG_EVERY": 1000}
WORDS = ("good", "great", "fine", "bad", "awful", "poor")


@dataclass
class Kind:
    """A kind of DATASET: where it runs (`cwd`), the settings of its first fit, what `predict` is given, and how
    its source is changed (None: a TFDS name, not changed by a user's files)."""

    name: str
    cwd: Path
    settings: dict[str, object]
    files: list[str]
    split: str
    change: object = None
    env: dict[str, object] = field(default_factory=dict)  # what every command of it has: TFDS_DATA_DIR, HOME
    first: subprocess.CompletedProcess | None = None

    @property
    def run(self) -> Path:
        return self.cwd / "run"

    def train(self, *args: str, **settings: object) -> subprocess.CompletedProcess:
        """`python -m train ARGS` in the kind's folder, with the kind's environment and only `settings` besides
        (MODEL and JIT_COMPILE unset: clean_env's would be settings the user gave)."""
        env = clean_env(**{"MODEL": None, "JIT_COMPILE": None, **self.env, **settings})
        return run_python(["-m", "train", *args], cwd=self.cwd, env=env, timeout=300)


def _no_traceback(result: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in result.stdout + result.stderr, result.stderr[-3000:]
    assert "This is a bug" not in result.stderr, result.stderr[-3000:]


def _ok(result: subprocess.CompletedProcess) -> None:
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    _no_traceback(result)


def _write_csv(path: Path, rows: int = 80) -> None:
    rng = np.random.default_rng(0)
    lines = ["age,income,note,label"]
    for index in range(rows):
        kind = int(rng.integers(0, 2))
        age = "" if index % 7 == 3 else str(30 + 20 * kind + int(rng.integers(0, 5)))  # empty cells, as exported
        income = "" if index % 11 == 5 else f"{rng.random() + kind:.3f}"
        note = " ".join(rng.choice(WORDS[3 * kind : 3 * kind + 3], 3))
        lines.append(f"{age},{income},{note},{'ny'[kind]}")
    path.write_text("\n".join(lines) + "\n")


def _write_reviews(path: Path, rows: int = 80) -> None:
    rng = np.random.default_rng(1)
    lines = []
    for _ in range(rows):
        kind = int(rng.integers(0, 2))
        text = " ".join(rng.choice(WORDS[3 * kind : 3 * kind + 3], 5))
        lines.append(json.dumps({"text": text, "label": ["pos", "neg"][kind]}))
    path.write_text("\n".join(lines) + "\n")


def _write_values(path: Path, rows: int = 80) -> None:
    """A table whose label is a value (a price): from age, income and the note's words, empty cells included."""
    rng = np.random.default_rng(2)
    records = []
    for index in range(rows):
        kind = int(rng.integers(0, 2))
        age = None if index % 7 == 3 else 30 + int(rng.integers(0, 30))
        income = None if index % 11 == 5 else round(float(rng.random()) * 3, 3)
        price = 2 * (age or 45) + 10 * (income or 1.5) + 25 * kind + float(rng.normal(0, 1))
        note = " ".join(rng.choice(WORDS[3 * kind : 3 * kind + 3], 3))
        records.append({"age": age, "income": income, "note": note, "label": round(price, 2)})
    if path.suffix == ".jsonl":
        path.write_text("".join(json.dumps(record) + "\n" for record in records))
    else:
        cells = [["" if value is None else str(value) for value in record.values()] for record in records]
        path.write_text("\n".join(",".join(row) for row in [list(records[0]), *cells]) + "\n")


def _add_image(kind: Kind) -> Path:
    root = kind.cwd / "photos"
    root = root / "train" if (root / "train").is_dir() else root
    added = root / "dog" / "added.jpg"
    shutil.copy(next((root / "cat").glob("*.jpg")), added)
    return added


def _add_row(path: str):
    def change(kind: Kind) -> Path:
        source = kind.cwd / path
        lines = source.read_text().splitlines()
        source.write_text("\n".join([*lines, lines[1]]) + "\n")
        return source

    return change


def _make(name: str, root: Path, tfds_data_dir: Path) -> Kind:
    """The kind's files, as a user has them, in `root`."""
    if name == "tfds":  # TFDS_DATA_DIR set empty: TFDS's default (HOME's), not the working directory
        home = root / "home"
        shutil.copytree(tfds_data_dir, home / "tensorflow_datasets", ignore=shutil.ignore_patterns("*.lock"))
        work = root / "work"
        photos(work / "synthetic_clusters", per_class=2)  # a folder of that name here: the name is still TFDS's
        (work / "rows.jsonl").write_text("".join(json.dumps({"features": [0.1 * i] * 32}) + "\n" for i in range(3)))
        settings = {"DATASET": "synthetic_clusters", "TRAIN_SPLIT": "train[:256]", "EVAL_SPLIT": "test[:64]",
                    "EPOCHS": 1, "BATCH_SIZE": 64, "LOG_EVERY": 1000}  # fmt: skip
        return Kind(name, work, settings, ["rows.jsonl"], "test[:8]", env={"HOME": home, "TFDS_DATA_DIR": ""})
    env = {"TFDS_DATA_DIR": root / "tfds"}
    if name in ("folder", "split_folders"):
        (root / "resized.py").write_text(RESIZED)
        if name == "folder":
            photos(root / "photos", per_class=6)
            dataset, split = "photos", "train[90%:]"  # a bare name: no TFDS builder has it, so the folder
        else:
            photos(root / "photos" / "train", per_class=5)
            photos(root / "photos" / "test", per_class=2, seed=1)
            dataset, split = "./photos", "test"
        (root / "loose").mkdir()
        for path in sorted((root / "photos").rglob("*.jpg"))[:3]:  # photos of the user's, outside the dataset
            shutil.copy(path, root / "loose" / path.name)
        settings = {"DATASET": dataset, "MODEL": "resized.py", **FAST}
        return Kind(name, root, settings, ["loose", "loose/" + path.name], split, _add_image, env)
    if name == "csv":
        _write_csv(root / "table.csv")
        (root / "rows.csv").write_text("age,income,note\n41,,good great fine\n,1.5,awful bad poor\n")
        return Kind(name, root, {"DATASET": "table.csv", **FAST}, ["rows.csv"], "train[90%:]",
                    _add_row("table.csv"), env)  # fmt: skip
    if name in VALUES:  # MODEL unset: the default table model, its regression head
        source = "values.csv" if name == "value_csv" else "values.jsonl"
        _write_values(root / source)
        if name == "value_csv":
            (root / "rows.csv").write_text("age,income,note\n41,,good great fine\n,1.5,awful bad poor\n")
        else:
            (root / "rows.jsonl").write_text('{"age": 41, "income": null, "note": "good great fine"}\n'
                                             '{"age": null, "income": 1.5, "note": "awful bad poor"}\n')  # fmt: skip
        files = ["rows.csv" if name == "value_csv" else "rows.jsonl"]
        return Kind(name, root, {"DATASET": source, **FAST}, files, "train[90%:]", _add_row(source), env)
    _write_reviews(root / "reviews.jsonl")
    (root / "rows.jsonl").write_text('{"text": "good great"}\n{"text": "awful poor bad"}\n')
    settings = {"DATASET": "./reviews.jsonl", "MODEL": "examples.text", **FAST}
    return Kind(name, root, settings, ["rows.jsonl"], "train[90%:]", _add_row("reviews.jsonl"), env)


KINDS = ["tfds", "folder", "split_folders", "csv", "jsonl"]
VALUES = ["value_csv", "value_jsonl"]  # a table whose label is a value (issue 58): slow, but for the cells named


def cells(*fast: str) -> list:
    """Every kind, the value tables slow but for those in `fast` (in the same order: the fixture's runs are shared)."""
    return [*KINDS, *(name if name in fast else pytest.param(name, marks=pytest.mark.slow) for name in VALUES)]


@pytest.fixture(scope="module", params=cells())
def kind(request, tmp_path_factory, tfds_data_dir) -> Kind:
    """The kind's files, and its first fit."""
    made = _make(request.param, tmp_path_factory.mktemp(request.param), tfds_data_dir)
    made.first = made.train("fit", OUTPUT_DIR=made.run, **made.settings)
    return made


@pytest.mark.parametrize("kind", cells("value_csv"), indirect=True)  # the value tables' one fast cell
def test_fit(kind):
    _ok(kind.first)
    summary = read_summary(kind.run)
    assert summary["steps"] > 0 and summary["eval"] is not None
    recorded = json.loads((kind.run / "run.json").read_text())
    assert recorded["data"]["kind"] == (
        "tfds" if kind.name == "tfds" else "images" if "folder" in kind.name else "table"
    )
    features = recorded["features"]  # what predict on files needs, so that it opens no source
    if kind.name in VALUES:  # a value: no classes, and the regression head's metrics
        assert features["classes"] is None and set(summary["eval"]) == {"loss", "mae", "rmse"}, summary["eval"]
    else:
        assert features["label_is_class"] is True and len(features["classes"]) >= 2
    assert features["images"] == (["image"] if "folder" in kind.name else [])
    assert (kind.run / "saved_model" / "saved_model.pb").is_file()
    if kind.name == "tfds":  # nothing written here: TFDS's default is HOME's tensorflow_datasets
        assert sorted(path.name for path in kind.cwd.iterdir()) == ["rows.jsonl", "run", "synthetic_clusters"]


def test_a_tfds_name_runs_from_inside_its_own_data_directory(kind):
    if kind.name != "tfds":
        pytest.skip("a TFDS name's")
    data_dir = Path(kind.env["HOME"]) / "tensorflow_datasets"  # holds synthetic_clusters/: still the TFDS name
    result = run_python(
        ["-m", "train", "fit"],
        cwd=data_dir,
        timeout=300,
        env=clean_env(
            **{**kind.env, **kind.settings, "TRAIN_SPLIT": "train[:64]", "OUTPUT_DIR": kind.cwd / "from-data-dir"}
        ),
    )
    _ok(result)
    assert read_summary(kind.cwd / "from-data-dir")["dataset"].startswith("synthetic_clusters")


def test_fit_on_the_run_directory_alone_continues_it_with_this_hosts_devices(kind):
    before = read_summary(kind.run)
    result = kind.train("fit", "--output-dir", str(kind.run), "--epochs", "2", CPU_DEVICES=2)
    _ok(result)
    warnings = [line for line in result.stderr.splitlines() if line.startswith("warning:")]
    expected = ("warning: the global batch is ", "warning: resuming with settings changed since this run directory's "
                "last start: CPU_DEVICES 1 -> 2.")  # fmt: skip
    assert all(line.startswith(expected) for line in warnings), warnings  # nothing else differs from the run
    summary = read_summary(kind.run)
    assert summary["resumed_from_step"] == before["steps"] and summary["steps"] > before["steps"]
    assert summary["replicas"] == 2  # CPU_DEVICES is this machine's: from the environment, not the run
    settings = json.loads((kind.run / "settings.json").read_text())
    assert settings["DATASET"] == _as_recorded(kind, kind.settings["DATASET"]) and settings["EPOCHS"] == "2"
    default = "examples.mlp_table" if kind.name in ("csv", *VALUES) else "examples.mlp"  # a table's: its own
    assert settings["MODEL"] == _as_recorded(kind, kind.settings.get("MODEL", default))


def _as_recorded(kind: Kind, text: object) -> str:
    """A setting's text as settings.json records it: a path absolute, a name (TFDS's, a module's) as given."""
    path = kind.cwd / str(text)
    return str(path) if path.exists() and kind.name != "tfds" else str(text)


def test_predict_files_and_a_split(kind):
    output = kind.cwd / "predictions.jsonl"
    result = kind.train("predict", "--output-dir", str(kind.run), *kind.files, "--split", kind.split,
                        "--output", str(output))  # fmt: skip
    _ok(result)
    lines = [json.loads(line) for line in output.read_text().splitlines()]
    classes = json.loads((kind.run / "run.json").read_text())["features"]["classes"]
    if kind.name in VALUES:  # a number a row, in the label's units (prices of about 100 to 200)
        assert lines and all(isinstance(line["prediction"], float) and line["prediction"] > 20 for line in lines)
    else:
        assert lines and all(line["class"] in classes for line in lines)
    split = [line for line in lines if line["input"].startswith(f"{kind.split}[")]
    assert split and len(split) < len(lines)  # the files' lines first, then the split's


def test_predict_on_files_needs_only_the_export_and_the_runs_records(kind, tmp_path):
    """The source and TFDS_DATA_DIR moved away: predict on files still answers, and writes nothing there."""
    if kind.change is None:
        pytest.skip("a TFDS name: its prepared files are TFDS's, not a user's")
    data_dir = Path(kind.env["TFDS_DATA_DIR"])
    source = kind.cwd / str(kind.settings["DATASET"])
    os.rename(source, tmp_path / "source")
    os.rename(data_dir, tmp_path / "tfds")
    try:
        result = kind.train("predict", "--output-dir", str(kind.run), *kind.files)
        made = data_dir.exists()  # nothing opened, nothing written
    finally:
        os.rename(tmp_path / "source", source)
        shutil.rmtree(data_dir, ignore_errors=True)
        os.rename(tmp_path / "tfds", data_dir)
    _ok(result)
    assert len(result.stdout.strip().splitlines()) >= 2
    assert not made


def _evaluate(kind: Kind) -> None:
    result = kind.train("evaluate", "--output-dir", str(kind.run))
    _ok(result)
    scores = json.loads(result.stdout[result.stdout.index("{") :])
    assert scores["examples"] > 0 and np.isfinite(scores["loss"])
    if kind.name in VALUES:
        assert np.isfinite(scores["mae"]) and np.isfinite(scores["rmse"]), scores
    assert scores["source"].startswith(str(kind.run / "checkpoints" / "ckpt-"))


def test_evaluate_and_a_changed_source_refused_by_fit_evaluate_and_predict_split(kind):
    """evaluate (every kind); a user's source changed (not a TFDS name's: tests/test_local_data.py prepares one anew)
    is refused by fit, evaluate and predict --split, and evaluated once it is put back (that evaluate is the kind's)."""
    if kind.change is None:
        _evaluate(kind)
        return
    checkpoints = sorted((kind.run / "checkpoints").iterdir())
    run_json = (kind.run / "run.json").read_text()
    saved = kind.cwd / "saved-source"
    source = kind.cwd / str(kind.settings["DATASET"])
    (shutil.copytree if source.is_dir() else shutil.copy2)(source, saved)
    kind.change(kind)
    try:
        commands = (("fit", "--output-dir", str(kind.run), "--epochs", "3"),
                    ("evaluate", "--output-dir", str(kind.run)),
                    ("predict", "--output-dir", str(kind.run), "--split", kind.split))  # fmt: skip
        for command in commands:
            result = kind.train(*command)
            assert result.returncode == 2, (command, result.stderr[-3000:])
            _no_traceback(result)
            [line] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
            assert f"DATASET={_as_recorded(kind, kind.settings['DATASET'])!r} has changed since OUTPUT_DIR=" in line
            assert "1 file(s) changed (" in line or "fingerprint differs" in line, line
            assert result.stdout.strip() == "" or command[0] == "fit"
    finally:
        (shutil.rmtree if source.is_dir() else os.remove)(source)
        os.rename(saved, source)
    assert sorted((kind.run / "checkpoints").iterdir()) == checkpoints  # nothing trained on it
    assert (kind.run / "run.json").read_text() == run_json
    copies = sorted(Path(kind.env["TFDS_DATA_DIR"]).iterdir())
    _evaluate(kind)  # put back: the same data, not written again
    assert sorted(Path(kind.env["TFDS_DATA_DIR"]).iterdir()) == copies


# A run started from the kind's run (INIT_FROM), its first Dense layer frozen for one epoch (FREEZE): every kind's
# model has one (a fresh process names the first "dense"), and what follows is the same.
STARTED = {"FREEZE": "dense", "UNFREEZE_AT_EPOCH": 2, "EPOCHS": 2}


FORMATS = not needs("formats").args[0]  # the formats extra is installed: the runs below are converted too (issue 57)


def _converted(kind: Kind, run: Path, result: subprocess.CompletedProcess | None = None) -> None:
    """`formats` on `run` (or, `result`: fit's EXPORT_FORMATS did it): ONNX and LiteRT within 1e-4 of model.keras."""
    result = result or kind.train("formats", "--output-dir", str(run))
    _ok(result)
    artifacts = json.loads((run / "formats" / "formats.json").read_text())["artifacts"]
    assert {name: artifacts[name]["parity"]["max_abs_difference"] <= 1e-4 for name in ("onnx", "litert")} == {
        "onnx": True, "litert": True,
    }, artifacts  # fmt: skip


@pytest.mark.slow
@needs("formats")
def test_the_kinds_run_converts_to_onnx_and_litert_with_parity(kind):
    _converted(kind, kind.run)


def _started_from(kind: Kind, run: Path) -> dict:
    """The summary of `run`, started from the kind's run, checked: every layer loaded, two phases recorded."""
    summary = read_summary(run)
    assert summary["initialized_from"]["source"] == str(kind.run) and summary["initialized_from"]["left_out"] == {}
    assert "dense" in summary["initialized_from"]["loaded"]
    assert [phase["first_epoch"] for phase in summary["phases"]] == [1, 2]
    assert [entry["phase"] for entry in json.loads((run / "epochs.json").read_text())] == [0, 1]
    return summary


@pytest.mark.slow
def test_a_run_started_from_the_kinds_run_frozen_then_trained_is_evaluated_and_predicts(kind):
    run = kind.cwd / "started"
    result = kind.train("fit", **{**kind.settings, **STARTED, "OUTPUT_DIR": run, "INIT_FROM": kind.run})
    _ok(result)
    assert f"INIT_FROM={kind.run}: " in result.stdout and "matched by layer name" in result.stdout
    _started_from(kind, run)
    evaluated = kind.train("evaluate", "--output-dir", str(run))
    _ok(evaluated)
    assert json.loads(evaluated.stdout[evaluated.stdout.index("{") :])["examples"] > 0
    predicted = kind.train("predict", "--output-dir", str(run), *kind.files)
    _ok(predicted)
    assert len(predicted.stdout.strip().splitlines()) >= 2
    if FORMATS:
        _converted(kind, run)


@pytest.mark.slow
def test_two_workers_started_from_the_kinds_run_cross_a_phase_boundary(kind):
    run = kind.cwd / "workers"
    settings = {"MODEL": None, **kind.env, **kind.settings, **STARTED, "OUTPUT_DIR": run, "INIT_FROM": kind.run,
                "WORKER_START_TIMEOUT": 120}  # fmt: skip
    if FORMATS:  # the chief converts after its export; the other worker writes nothing
        settings["EXPORT_FORMATS"] = "onnx,litert"
    workers = run_two_workers(kind.cwd, kind.cwd, **settings)
    texts = [text for _, text in workers]
    assert [code for code, _ in workers] == [0, 0], texts[0][-3000:] + texts[1][-3000:]
    assert not any("Traceback" in text for text in texts)
    summary = _started_from(kind, run)
    assert summary["workers"] == 2 and summary["eval"] is not None
    assert json.loads((run / "run.json").read_text())["data"] == json.loads((kind.run / "run.json").read_text())["data"]
    if FORMATS:
        assert "onnx: formats/model.onnx " in texts[0] and "formats/" not in texts[1]
        _converted(kind, run, subprocess.CompletedProcess([], 0, "", ""))
