"""Columns seen for what they are (issue 58, item 3): the default table model (examples/mlp_table.py) tells each
column's kind in one line at the start, takes a column of dates as year, month, day and weekday (computed in
`preprocess`, so in the export too), leaves out an ID (KEEP_COLUMNS keeps it) and records the kinds in run.json;
DROP_COLUMNS leaves columns out of the data itself. `adapt` in this process first, then one run end to end."""

from __future__ import annotations

import csv
import datetime
import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import run_train
from train import dataset_path
from train.data import local
from train.errors import SettingsError

WORDS = ("good great lovely fine fun superb", "bad awful dull poor boring grim")  # the notes' words, by class
CITIES = ("paris", "oslo", "rome")
FIRST_DAY = datetime.date(2023, 1, 1)
SETTINGS = {"EPOCHS": 2, "BATCH_SIZE": 16, "LEARNING_RATE": 0.01, "LOG_EVERY": 1000, "MODEL": None}  # MODEL unset
DATE_LINE = "as a date (year, month, day, weekday, missing)"
ID_LINE = "left out (a different value in every row)"


def columns(rows: int, form: str = "%Y-%m-%d", seed: int = 0) -> dict[str, list]:
    """A table's columns: id (whole numbers, one a row), ref (one word a row), age and rooms (numbers), city (three
    values), notes (words), date (in `form`, one cell empty), label (n or y)."""
    rng = np.random.default_rng(seed)
    kinds = rng.integers(0, 2, rows)
    days = [FIRST_DAY + datetime.timedelta(days=int(day)) for day in rng.integers(0, 700, rows)]
    return {
        "id": [1000 + 7 * i for i in range(rows)],
        "ref": [f"r{i:05d}" for i in range(rows)],
        "age": [30 + 15 * int(k) + int(rng.integers(0, 10)) for k in kinds],
        "rooms": [int(rng.integers(1, 6)) for _ in range(rows)],
        "city": [CITIES[i % 3] for i in range(rows)],
        "notes": [" ".join(rng.choice(WORDS[k].split(), 3)) for k in kinds],
        "date": ["" if i == 1 else day.strftime(form) for i, day in enumerate(days)],
        "label": ["ny"[k] for k in kinds],
    }


def write_csv(path: Path, table: dict[str, list]) -> None:
    with open(path, "w", newline="") as stream:
        writer = csv.writer(stream)
        writer.writerow(table)
        writer.writerows(zip(*table.values(), strict=True))


class Context:
    """What `adapt(context)` reads (train.data.adapt.AdaptContext's fields), over rows in memory."""

    def __init__(self, table: dict[str, list], keep: tuple[str, ...] = ()):
        self.table, self.label_key, self.keep_columns, self.said = table, "label", keep, []

    def examples(self, n: int):
        import tensorflow as tf

        return tf.data.Dataset.from_tensor_slices(self.table).take(n).batch(256)

    def say(self, line: str) -> None:
        self.said.append(line)


def adapted(table: dict[str, list], keep: tuple[str, ...] = ()) -> tuple[dict[str, str], list[str]]:
    from examples import mlp_table

    context = Context(table, keep)
    return mlp_table.adapt(context), context.said


def expected_line(table: dict[str, list], *, id_kind: str = ID_LINE) -> str:
    tokens = len({word for note in table["notes"] for word in note.split()})
    return (
        f"Columns: 2 numbers (normalised), city looked up ({len(set(table['city']))} values), date {DATE_LINE}, id "
        f"{id_kind}, notes as words ({tokens} tokens), ref {ID_LINE}"
    )


# --- adapt, in this process -------------------------------------------------------------------------------------


def test_each_kind_of_column_is_told_in_one_line_and_returned():
    table = columns(120)
    kinds, said = adapted(table)
    assert said == [expected_line(table)]
    assert kinds == {"age": "number", "city": "looked up", "date": "date yyyy-mm-dd", "id": "left out",
                     "notes": "words", "ref": "left out", "rooms": "number"}  # fmt: skip


@pytest.mark.parametrize(
    ("form", "told"),
    [("%Y-%m-%d", "yyyy-mm-dd"), ("%Y/%m/%d", "yyyy/mm/dd"), ("%d/%m/%Y", "dd/mm/yyyy"), ("%m/%d/%Y", "mm/dd/yyyy")],
)
def test_a_column_of_dates_becomes_year_month_day_weekday_and_missing(form, told):
    import tensorflow as tf

    from examples import mlp_table

    table = columns(120, form)
    kinds, _ = adapted(table)
    assert kinds["date"] == f"date {told}"
    known = datetime.date(2024, 3, 15)  # a Friday
    for text, date in ((known.strftime(form), known), ("", None), ("not a date", None)):
        features, valid = mlp_table._date(tf.constant(text), told)
        got = features.numpy().tolist()
        assert got == ([date.year, date.month, date.day, date.weekday()] if date else [0, 0, 0, 0]), text
        assert bool(valid) == (date is not None)
    row = {name: tf.constant(values[0]) for name, values in table.items()}
    for text, missing in ((known.strftime(form), 0.0), ("", 1.0)):
        inputs, _ = mlp_table.preprocess({**row, "date": tf.constant(text)}, False, tf.constant(0))
        year, month, day, weekday = mlp_table.DATES["date"](tf.constant([[2024.0, 3, 15, 4]]))[0].numpy()
        assert inputs.numpy()[-5:].tolist() == pytest.approx([year, month, day, weekday, 0.0] if not missing
                                                             else [0, 0, 0, 0, 1.0])  # fmt: skip


def test_day_and_month_in_an_order_the_values_do_not_tell_are_not_a_date():
    table = columns(120, "%d/%m/%Y")
    table["date"] = [f"{1 + i % 12:02d}/{1 + i % 12:02d}/2024" for i in range(120)]  # never past 12: which is which?
    kinds, said = adapted(table)
    assert kinds["date"] == "looked up" and "date looked up (12 values)" in said[0]


def test_an_id_is_kept_with_keep_columns_as_the_kind_it_would_be():
    table = columns(120)
    kinds, said = adapted(table, keep=("id", "ref"))
    assert kinds["id"] == "number" and kinds["ref"] == "words"
    assert said[0].startswith("Columns: 3 numbers (normalised), ") and ID_LINE not in said[0]
    with pytest.raises(ValueError, match=r"^KEEP_COLUMNS='id,nope': 'nope' is not a column the model takes: use "):
        adapted(table, keep=("id", "nope"))


def test_few_rows_or_free_text_that_differs_in_every_row_is_no_id():
    kinds, _ = adapted(columns(20))  # too few rows to tell an ID from chance
    assert kinds["id"] == "number" and kinds["ref"] == "looked up"  # 20 values: at most LOOKUP_VALUES
    table = columns(120)
    table["notes"] = [f"{note} ref{i}" for i, note in enumerate(table["notes"])]  # every row its own, but words
    assert adapted(table)[0]["notes"] == "words"


# --- DROP_COLUMNS: the data itself, no TensorFlow ----------------------------------------------------------------


def test_drop_columns_leaves_columns_out_of_the_table_and_refuses_what_is_not_one(tmp_path):
    write_csv(tmp_path / "t.csv", columns(10))
    survey = dataset_path.survey(str(tmp_path / "t.csv"))
    table = local.read_table(survey, "label", None, local.Read(), drop=("notes", "id"))
    assert [column.name for column in table.columns] == ["ref", "age", "rooms", "city", "date", "label"]
    assert set(table.rows["train"][0]) == {"ref", "age", "rooms", "city", "date", "label"}
    for drop, why in ((("notes", "nope"), f"'nope' is not a column of {survey.root}"),
                      (("label",), "'label' is the label (LABEL_KEY)")):  # fmt: skip
        with pytest.raises(SettingsError) as error:
            local.read_table(survey, "label", None, local.Read(), drop=drop)
        assert str(error.value) == (
            f"DROP_COLUMNS={','.join(drop)!r}: {why}: use some of id, ref, age, rooms, city, notes, date"
        )


def test_drop_and_keep_columns_are_settings_of_column_names(tmp_path):
    from train.settings import load_settings

    write_csv(tmp_path / "t.csv", columns(10))
    settings = load_settings(
        environ={"DATASET": str(tmp_path / "t.csv"), "DROP_COLUMNS": "notes, id", "KEEP_COLUMNS": "ref"},
        dotenv_path=tmp_path / ".env",
    )
    assert (settings.drop_columns, settings.keep_columns) == (("notes", "id"), ("ref",))
    with pytest.raises(SettingsError, match=r"^DROP_COLUMNS='a,,b' is not allowed: use comma-separated column names"):
        load_settings(environ={"DATASET": str(tmp_path / "t.csv"), "DROP_COLUMNS": "a,,b"}, dotenv_path=tmp_path / "e")
    with pytest.raises(SettingsError, match=r"^DROP_COLUMNS='id' is set but DATASET='mnist' is not a CSV or JSON"):
        load_settings(environ={"DATASET": "mnist", "DROP_COLUMNS": "id"}, dotenv_path=tmp_path / "e")


# --- end to end: fit with MODEL unset, predict on raw rows, run.json ------------------------------------------------


def table_settings(folder: Path, run: str, **more: object) -> dict[str, object]:
    return {**SETTINGS, "DATASET": "./table.csv", "TFDS_DATA_DIR": folder / "tfds", "OUTPUT_DIR": folder / run, **more}


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A table of every kind of column trained with MODEL unset: (its folder, the run, what the start said)."""
    folder = tmp_path_factory.mktemp("columns")
    write_csv(folder / "table.csv", columns(160))
    result = run_train("fit", cwd=folder, **table_settings(folder, "run"))
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
    return folder, folder / "run", result.stdout + result.stderr


def test_the_start_says_each_column_and_run_json_records_its_kind(trained):
    _, run, said = trained
    lines = [line for line in said.splitlines() if line.startswith("Columns: ")]
    words = len(" ".join(WORDS).split())  # every one of them in 144 rows of three
    assert lines == [
        f"Columns: 2 numbers (normalised), city looked up ({len(CITIES)} values), date {DATE_LINE}, id {ID_LINE}, "
        f"notes as words ({words} tokens), ref {ID_LINE}"
    ]
    kinds = json.loads((run / "run.json").read_text())["adapted"]["adapt"]["returned"]
    assert kinds == {"age": "number", "city": "looked up", "date": "date yyyy-mm-dd", "id": "left out",
                     "notes": "words", "ref": "left out", "rooms": "number"}  # fmt: skip
    assert "DATES['date']" in json.loads((run / "run.json").read_text())["adapted"]


def test_predict_on_raw_rows_computes_the_dates_in_the_export(trained, tmp_path):
    folder, run, _ = trained
    rows = tmp_path / "rows.csv"
    rows.write_text(
        "id,ref,age,rooms,city,notes,date\n1,x,31,2,oslo,good fun,2024-03-15\n2,y,50,3,rome,grim dull,\n"
        "3,z,50,3,rome,grim dull,15/03/2024\n4,w,50,3,rome,grim dull,2024-03-15\n"
    )
    result = run_train("predict", "--output-dir", str(run), str(rows), cwd=folder, MODEL=None)
    assert result.returncode == 0, result.stderr[-3000:]
    predicted = [json.loads(line) for line in result.stdout.splitlines()]
    assert [line["class"] for line in predicted[:2]] == ["n", "y"]  # the notes' words decide
    assert predicted[1]["scores"] == predicted[2]["scores"]  # no date and a date of another form: both missing
    assert predicted[3]["scores"] != predicted[2]["scores"]  # the same row with a date: the export read it


def test_a_drop_or_keep_columns_that_is_not_a_column_is_one_line_and_nothing_is_written(trained, tmp_path):
    folder, _, _ = trained
    result = run_train("fit", cwd=folder, **table_settings(folder, "bad", DROP_COLUMNS="notes,nope"))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert result.stderr.strip().splitlines()[-1].startswith("error: DROP_COLUMNS='notes,nope': 'nope' is not a ")
    assert not (folder / "bad").exists()
    result = run_train("fit", cwd=folder, **table_settings(folder, "bad", KEEP_COLUMNS="nope"))
    assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
    said = result.stderr.strip().splitlines()[-1]
    assert "KEEP_COLUMNS='nope': 'nope' is not a column the model takes: use some of age, city, date, id, " in said
    assert not (folder / "bad").exists()


def test_dropped_columns_never_reach_the_model_and_kept_ones_do(trained, tmp_path):
    folder, run, _ = trained
    result = run_train("fit", cwd=folder, **table_settings(folder, "drop", DROP_COLUMNS="notes,ref", KEEP_COLUMNS="id"))
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [line for line in (result.stdout + result.stderr).splitlines() if line.startswith("Columns: ")]
    assert lines == [f"Columns: 3 numbers (normalised), city looked up ({len(CITIES)} values), date {DATE_LINE}"]
    recorded, before = (json.loads((each / "run.json").read_text()) for each in (folder / "drop", run))
    assert recorded["adapted"]["adapt"]["returned"] == {"age": "number", "city": "looked up", "date": "date yyyy-mm-dd",
                                                        "id": "number", "rooms": "number"}  # fmt: skip
    assert recorded["data"]["name"] != before["data"]["name"]  # other data: a copy of its own
    rows = tmp_path / "rows.csv"
    rows.write_text("id,age,rooms,city,date\n1,31,2,oslo,2024-03-15\n")  # no notes, no ref: the export takes none
    for output_dir, code in ((folder / "drop", 0), (run, 2)):
        result = run_train("predict", "--output-dir", str(output_dir), str(rows), cwd=folder, MODEL=None)
        assert result.returncode == code, result.stderr[-3000:]


def test_keep_columns_that_no_adapt_reads_is_refused_in_one_line(trained, tmp_path):
    folder, _, _ = trained
    own = tmp_path / "own.py"  # a fork's model whose adapt never reads context.keep_columns
    own.write_text("def adapt(context):\n    pass\n\n\ndef build_model(input_shape, num_classes, learning_rate):\n"
                   "    raise ValueError('not reached: KEEP_COLUMNS is refused first')\n")  # fmt: skip
    for model in ("examples.tabular", str(own)):  # no adapt; an adapt that never reads keep_columns
        result = run_train("fit", cwd=folder, **table_settings(folder, "kept", MODEL=model, KEEP_COLUMNS="id"))
        assert result.returncode == 2 and "Traceback" not in result.stderr, result.stderr[-3000:]
        said = result.stderr.strip().splitlines()[-1]
        assert said.startswith(f"error: KEEP_COLUMNS='id': no adapt(context) of MODEL='{model}' reads "), said
        assert not (folder / "kept").exists()
