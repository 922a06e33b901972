"""Tables as people export them: a CSV with empty cells, a column of few text values and one of free text, trained
with MODEL unset (examples/mlp_table.py: the documented MLP behind a preprocessing adapted on the train split),
resumed, evaluated, predicted from raw rows and served from the export on the raw columns, on 1 device and 2
replicas. The reading itself (no TensorFlow) first; the runs in processes of their own."""

from __future__ import annotations

import csv
import json
import math
import subprocess
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import REPO, read_summary, run_python, run_train
from tests.harness.runs import run_two_workers
from train import dataset_path
from train.data import local
from train.errors import SettingsError

WORDS = ("good great lovely fine fun superb", "bad awful dull poor boring grim")  # the review's words, by class
SETTINGS = {"EPOCHS": 2, "BATCH_SIZE": 16, "LEARNING_RATE": 0.01, "LOG_EVERY": 1000, "MODEL": None}  # MODEL unset


def export(path: Path, rows: int = 240, seed: int = 0) -> dict[str, int]:
    """A spreadsheet's export: age (whole numbers, some empty), income (some empty), rooms (whole, never empty),
    city (3 values, some empty), review (free text), label (yes/no). Returns each numeric column's empty cells."""
    rng = np.random.default_rng(seed)
    lines = [["age", "income", "rooms", "city", "review", "label"]]
    for i in range(rows):
        k = int(rng.integers(0, 2))
        age = "" if i % 7 == 0 else str(30 + 15 * k + int(rng.integers(0, 10)))
        income = "" if i % 5 == 0 else f"{rng.normal(1.0 + k, 0.3):.3f}"
        review = " ".join(rng.choice(WORDS[k].split(), 3)) + f" ref{i}"  # a reference number: many distinct texts
        lines.append([age, income, str(int(rng.integers(1, 6))), ["paris", "oslo", ""][i % 3], review, "ny"[k]])
    with open(path, "w", newline="") as stream:
        csv.writer(stream).writerows(lines)
    return {"age": sum(not row[0] for row in lines[1:]), "income": sum(not row[1] for row in lines[1:])}


def table_settings(tmp: Path, output_dir: Path, **more: object) -> dict[str, object]:
    return {**SETTINGS, "DATASET": "./table.csv", "TFDS_DATA_DIR": tmp / "tfds", "OUTPUT_DIR": output_dir, **more}


def adapted(run: Path) -> dict:
    return json.loads((run / "run.json").read_text())["adapted"]


def error_line(result: subprocess.CompletedProcess) -> str:
    assert "Traceback" not in result.stderr, result.stderr[-3000:]
    return result.stderr.strip().splitlines()[-1]


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """The export trained start to end on one device with MODEL unset: (its folder, the run, the start's output,
    each numeric column's empty cells)."""
    folder = tmp_path_factory.mktemp("table")
    empty = export(folder / "table.csv")
    result = run_train("fit", cwd=folder, **table_settings(folder, folder / "run"))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return folder, folder / "run", result.stdout + result.stderr, empty


# --- the reading, no TensorFlow ---------------------------------------------------------------------------------


def test_an_empty_number_is_missing_and_an_empty_text_is_empty(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("n,whole,x,word,label\n1,3,0.5,a,yes\n,4,,,no\n3,5, ,b,yes\n")
    read = local.Read()
    table = local.read_table(dataset_path.survey(str(path)), "label", None, read)
    kinds = {column.name: column.dtype for column in table.columns}
    assert kinds == {"n": "float32", "whole": "int64", "x": "float32", "word": "string", "label": "int64"}
    second, third = table.rows["train"][1:]
    assert math.isnan(second["n"]) and math.isnan(second["x"]) and math.isnan(third["x"])  # spaces: empty too
    assert second["word"] == "" and third["n"] == 3.0
    assert read.missing == {"n": 1, "x": 2}

    path = tmp_path / "t.jsonl"
    path.write_text('{"n": 1, "word": "a", "label": 0}\n{"n": null, "word": null, "label": 1}\n{"label": 1}\n')
    read = local.Read()
    rows = local.read_table(dataset_path.survey(str(path)), "label", None, read).rows["train"]
    assert math.isnan(rows[1]["n"]) and math.isnan(rows[2]["n"]) and rows[1]["word"] == rows[2]["word"] == ""
    assert read.missing == {"n": 2}


def test_an_empty_label_is_refused_naming_its_rows(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("a,label\n1,x\n2,\n3,\n4,y\n")
    with pytest.raises(SettingsError) as error:
        local.read_table(dataset_path.survey(str(path)), "label", None, local.Read())
    assert "column 'label' is the label but 2 rows are empty (row 3 of train, row 4 of train): fill" in str(error.value)


def test_the_default_model_on_a_table_is_the_documented_mlp_behind_its_preprocessing(tmp_path, monkeypatch):
    from train.settings import load_settings

    monkeypatch.chdir(tmp_path)
    export(tmp_path / "table.csv", rows=10)
    for given in ({}, {"MODEL": "examples.mlp"}, {"MODEL": str(REPO / "examples" / "mlp.py")}):
        settings = load_settings(environ={"DATASET": "./table.csv", **given}, dotenv_path=tmp_path / ".env")
        assert settings.model == "examples.mlp_table", given
    kept = load_settings(environ={"DATASET": "./table.csv", "MODEL": "examples.tabular"}, dotenv_path=tmp_path / "e")
    one_column = load_settings(environ={"DATASET": "./table.csv", "FEATURE_KEY": "age"}, dotenv_path=tmp_path / "e")
    images = load_settings(environ={"DATASET": "mnist"}, dotenv_path=tmp_path / ".env")
    assert (kept.model, one_column.model, images.model) == ("examples.tabular", "examples.mlp", "examples.mlp")


# --- trained with MODEL unset: fit, resume, evaluate, predict, the export --------------------------------------


def test_an_export_with_empty_cells_and_text_trains_with_model_unset(trained):
    _, run, said, empty = trained
    assert json.loads((run / "settings.json").read_text())["MODEL"] == "examples.mlp_table"
    assert f"Empty numeric cells, stored as missing (NaN): age {empty['age']}, income {empty['income']}." in said
    state = adapted(run)
    assert set(state) == {"NUMBERS", "LOOKUPS['city']", "BAGS['review']", "adapt"}  # adapt: each column's kind
    assert all(math.isfinite(value) for value in state["NUMBERS"]["mean"] + state["NUMBERS"]["variance"])
    assert len(state["NUMBERS"]["mean"]) == 3  # age, income, rooms
    assert state["LOOKUPS['city']"]["vocabulary"]["size"] == 4  # paris, oslo, "" and the out-of-vocabulary slot
    assert state["BAGS['review']"]["layer"] == "TextVectorization"
    assert read_summary(run)["eval"]["accuracy"] >= 0.9, read_summary(run)["eval"]  # chance: 0.5


def test_a_resumed_table_run_ends_with_the_weights_of_the_uninterrupted_one(trained, tmp_path):
    folder, run, _, _ = trained
    cut = tmp_path / "cut"
    for epochs in (1, 2):
        result = run_train("fit", cwd=folder, **table_settings(folder, cut, EPOCHS=epochs))
        assert result.returncode == 0, result.stderr[-3000:]
    assert read_summary(cut)["resumed_from_step"] == read_summary(run)["steps"] // 2
    assert read_summary(cut)["weights_sha256"] == read_summary(run)["weights_sha256"]


def test_evaluate_scores_a_table_run_as_fit_did(trained):
    folder, run, _, _ = trained
    result = run_train("evaluate", "--output-dir", str(run), cwd=folder, MODEL=None)
    assert result.returncode == 0, result.stderr[-3000:]
    scored = json.loads(result.stdout[result.stdout.index("{") :])
    assert scored["accuracy"] == pytest.approx(read_summary(run)["eval"]["accuracy"])


# The export's serving_default fed the raw columns directly: its input types, and the scores of rows with an age
# and without one (NaN), to compare with what `predict` writes for the same rows.
SERVED = """
import json, sys
import numpy as np, tensorflow as tf
serve = tf.saved_model.load(sys.argv[1] + "/saved_model").signatures["serving_default"]
rows = {"age": [np.nan, 40.0], "income": [1.5, np.nan], "rooms": [2, 3], "city": ["oslo", "rome"],
        "review": ["superb fun lovely", "grim"]}
inputs = serve.structured_input_signature[1]
sent = {name: tf.constant(values, inputs[name].dtype) for name, values in rows.items()}
scores = serve(**sent)["scores"].numpy()
print(json.dumps({"inputs": {name: spec.dtype.name for name, spec in inputs.items()}, "scores": scores.tolist()}))
"""


def test_the_export_and_predict_take_the_raw_columns_an_empty_number_as_nan(trained, tmp_path):
    folder, run, _, _ = trained
    served = run_python(["-c", SERVED, str(run)])
    assert served.returncode == 0, served.stderr[-3000:]
    served = json.loads(served.stdout.strip().splitlines()[-1])
    assert served["inputs"] == {"age": "float32", "income": "float32", "rooms": "int64", "city": "string",
                                "review": "string"}  # fmt: skip
    rows = tmp_path / "rows.csv"  # as a spreadsheet saves "CSV UTF-8": with a byte-order mark
    rows.write_text("\ufeffage,income,rooms,city,review\n,1.5,2,oslo,superb fun lovely\n40,,3,rome,grim\n")
    lines = tmp_path / "rows.jsonl"
    lines.write_text(json.dumps({"age": None, "income": 1.5, "rooms": 2, "city": "oslo", "review": "superb fun lovely"})
                     + "\n")  # fmt: skip
    result = run_train("predict", "--output-dir", str(run), str(rows), str(lines), cwd=folder, MODEL=None)
    assert result.returncode == 0, result.stderr[-3000:]
    predicted = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["input"] for line in predicted] == [f"{rows}:2", f"{rows}:3", f"{lines}:1"]
    for line, scores in zip(predicted, [*served["scores"], served["scores"][0]], strict=True):
        assert [line["scores"]["n"], line["scores"]["y"]] == pytest.approx(scores, abs=1e-6)
    assert predicted[0]["class"] == "n" and predicted[1]["class"] == "y"  # the review's words decide


def test_predict_on_the_export_itself_finds_its_labels(trained):
    folder, run, _, _ = trained
    result = run_train("predict", "--output-dir", str(run), "table.csv", cwd=folder, MODEL=None)
    assert result.returncode == 0, result.stderr[-3000:]
    with open(folder / "table.csv", newline="") as stream:
        labels = [row["label"] for row in csv.DictReader(stream)]
    classes = [json.loads(line)["class"] for line in result.stdout.splitlines()]
    assert len(classes) == len(labels) and np.mean(np.array(classes) == np.array(labels)) >= 0.9


def test_an_empty_cell_where_the_model_takes_a_whole_number_is_one_line(trained, tmp_path):
    folder, run, _, _ = trained
    rows = tmp_path / "rows.csv"
    rows.write_text("age,income,rooms,city,review\n30,1.5,,oslo,fun\n")
    result = run_train("predict", "--output-dir", str(run), str(rows), cwd=folder, MODEL=None)
    assert result.returncode == 2 and result.stdout == ""
    assert error_line(result) == (
        f"error: {rows}:2: column 'rooms' is empty, but the model takes an int64 there, which cannot be missing (the "
        "training data had no empty cell in it): fill it in"
    )
    rows.write_text("age,income,rooms,city,review\nold,1.5,two,oslo,fun\n")
    result = run_train("predict", "--output-dir", str(run), str(rows), cwd=folder, MODEL=None)
    said = error_line(result)  # every bad column of the row, whatever the signature's order
    assert said.startswith(f"error: {rows}:2: column ") and said.count("; ") == 1
    assert "column 'age' is 'old', not a float32" in said and "column 'rooms' is 'two', not an int64" in said
    rows.write_text("age,income,city\n30,1.5,oslo\n")
    result = run_train("predict", "--output-dir", str(run), str(rows), cwd=folder, MODEL=None)
    assert error_line(result).startswith(f"error: {rows}:2: no columns 'review', 'rooms', which the model takes")


def test_a_model_without_preprocess_is_told_every_text_column_and_the_example_that_fits(tmp_path):
    export(tmp_path / "table.csv", rows=40)
    run = tmp_path / "run"
    result = run_train("fit", cwd=tmp_path, **table_settings(tmp_path, run, MODEL="examples.tabular"))
    assert result.returncode == 2 and not run.exists()
    line = error_line(result)
    assert "the columns 'city', 'review' hold text, which MODEL='examples.tabular' cannot take as it is" in line
    assert "(see examples/tabular_text.py)" in line and "MODEL unset, or examples.mlp_table" in line


@pytest.mark.slow
def test_two_replicas_adapt_the_same_state_and_train_the_table(trained, tmp_path):
    folder, run, _, _ = trained
    two = tmp_path / "two"
    result = run_train("fit", cwd=folder, **table_settings(folder, two, CPU_DEVICES=2, BATCH_SIZE=8))
    assert result.returncode == 0, result.stderr[-3000:]
    assert adapted(two) == adapted(run)
    assert read_summary(two)["replicas"] == 2 and read_summary(two)["eval"]["accuracy"] >= 0.9


@pytest.mark.slow
def test_two_workers_adapt_the_same_state_as_one_device(trained, tmp_path):
    folder, run, _, _ = trained
    two = tmp_path / "workers"
    workers = run_two_workers(folder, tmp_path, TMPDIR=tmp_path, **table_settings(folder, two, BATCH_SIZE=8))
    assert [code for code, _ in workers] == [0, 0], workers[0][1][-4000:] + workers[1][1][-2000:]
    assert adapted(two) == adapted(run)
    assert read_summary(two)["workers"] == 2
