"""A CSV as it is shipped: tab-, semicolon- or pipe-separated, its names quoted with ' or ", numbers written with a
decimal comma. The delimiter and quote are found from the header and first rows (csv.Sniffer) or told
(CSV_DELIMITER); the reading itself first (no TensorFlow), then runs in processes of their own."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from tests.conftest import clean_env, run_python, run_train
from train import dataset_path
from train.data import local
from train.errors import SettingsError
from train.settings import load_settings

FAST = {"EPOCHS": 1, "BATCH_SIZE": 8, "LOG_EVERY": 1000, "MODEL": None}


def survey_table(path: Path, content: str, delimiter: str | None = None, label_key: str | None = "label"):
    """`content` written to `path`, read as DATASET (CSV_DELIMITER=`delimiter`): its Table and what reading gave."""
    path.write_text(content)
    read = local.Read()
    return local.read_table(dataset_path.survey(str(path)), label_key, None, read, delimiter=delimiter), read


def votes(rows: int = 80, seed: int = 0) -> list[tuple[float, int, int, int]]:
    """A survey's answers like a shipped tab-separated one's: population (a decimal), hours of TV news and a
    left-right scale (whole numbers), and the vote (0 or 1) that follows the scale."""
    rng = np.random.default_rng(seed)
    answers = []
    for _ in range(rows):
        scale = int(rng.integers(1, 8))
        answers.append((round(float(rng.random() * 300), 1), int(rng.integers(0, 8)), scale, int(scale > 4)))
    return answers


def tab_file(path: Path, answers: list) -> Path:
    """Tab-separated, its header names quoted with ' (as `'popul'\t'TVnews'\t...`), its values not."""
    lines = ["\t".join(f"'{name}'" for name in ("popul", "TVnews", "selfLR", "vote"))]
    lines += ["\t".join(str(value) for value in answer) for answer in answers]
    path.write_text("\n".join(lines) + "\n")
    return path


# --- the reading, no TensorFlow ----------------------------------------------------------------------------------


def test_a_tab_file_whose_header_names_are_quoted_with_apostrophes_reads_its_columns(tmp_path):
    answers = votes(12)
    tab_file(tmp_path / "anes.csv", answers)
    read = local.Read()
    table = local.read_table(dataset_path.survey(str(tmp_path / "anes.csv")), "vote", None, read)
    kinds = {column.name: column.dtype for column in table.columns}
    assert kinds == {"popul": "float32", "TVnews": "int64", "selfLR": "int64", "vote": "int64"}
    assert [row["popul"] for row in table.rows["train"]] == pytest.approx([answer[0] for answer in answers])
    assert list(read.dialects.values()) == ["tab-separated, quoted with ', decimal point"]


def test_a_semicolon_file_with_decimal_commas_reads_them_as_numbers(tmp_path):
    table, read = survey_table(
        tmp_path / "eu.csv", "price;rooms;city;label\n3,14;2;Lyon;a\n-0,5;3;Gent;b\n12;1;Graz;a\n"
    )
    kinds = {column.name: column.dtype for column in table.columns}
    assert kinds == {"price": "float32", "rooms": "int64", "city": "string", "label": "int64"}
    assert [row["price"] for row in table.rows["train"]] == pytest.approx([3.14, -0.5, 12.0])
    assert list(read.dialects.values()) == ['semicolon-separated, quoted with ", decimal comma']


def test_a_decimal_comma_is_a_files_choice_never_a_comma_files(tmp_path):
    """A tab file with a point decimal keeps its commas as text; so does a comma file (its `1,000` quoted)."""
    table, read = survey_table(tmp_path / "points.csv", "size\tcode\tlabel\n1.5\t1,5\ta\n2\t2,5\tb\n")
    assert [(column.name, column.dtype) for column in table.columns][:2] == [("size", "float32"), ("code", "string")]
    assert list(read.dialects.values()) == ['tab-separated, quoted with ", decimal point']
    table, read = survey_table(tmp_path / "comma.csv", 'amount,label\n"1,000",a\n"2,5",b\n')
    assert [row["amount"] for row in table.rows["train"]] == ["1,000", "2,5"]
    assert list(read.dialects.values()) == ['comma-separated, quoted with ", decimal point']


def test_an_apostrophe_opening_a_cell_is_no_quote(tmp_path):
    """csv.Sniffer takes ' for this file's quote (`'best'`); read so, `'90s hits,1` would open a quoted cell."""
    table, read = survey_table(tmp_path / "t.csv", "id,text,label\n1,'90s hits,1\n2,the 'best' one,0\n3,'tis so,1\n")
    assert [row["text"] for row in table.rows["train"]] == ["'90s hits", "the 'best' one", "'tis so"]
    assert list(read.dialects.values()) == ['comma-separated, quoted with ", decimal point']


def test_a_tsv_file_is_a_tab_separated_table(tmp_path):
    table, _ = survey_table(tmp_path / "t.tsv", "a\tb\tlabel\n1\t0.5\tx\n2\t1.5\ty\n")
    assert [column.name for column in table.columns] == ["a", "b", "label"]
    folder = tmp_path / "splits"
    folder.mkdir()
    (folder / "train.tsv").write_text("a\tlabel\n1\tx\n2\ty\n")
    (folder / "test.csv").write_text("a,label\n3,x\n")
    assert sorted(dataset_path.survey(str(folder)).splits) == ["test", "train"]  # one reader: a CSV's


def test_csv_delimiter_says_the_delimiter_instead_of_the_file(tmp_path):
    content = "name,city|label\nAnn,Oslo|x\nBob,Rome|y\nCy,Graz|x\n"  # either delimiter alike in every row
    sniffed, _ = survey_table(tmp_path / "t.csv", content, label_key=None)
    assert [column.name for column in sniffed.columns] == ["name", "city|label"]
    told, read = survey_table(tmp_path / "t.csv", content, "pipe", label_key=None)
    assert [column.name for column in told.columns] == ["name,city", "label"]
    assert list(read.dialects.values()) == ['pipe-separated, quoted with ", decimal point']
    environ = {"DATASET": str(tmp_path / "t.csv"), "CSV_DELIMITER": "tab"}
    assert load_settings({}, environ, Path("/nonexistent/.env"), defaults_path=None).csv_delimiter == "tab"


@pytest.mark.parametrize("value", [";", "TAB", "\\t"])
def test_a_bad_csv_delimiter_is_one_line_naming_the_four_words(value):
    with pytest.raises(SettingsError) as error:
        load_settings({}, {"CSV_DELIMITER": value}, Path("/nonexistent/.env"), defaults_path=None)
    assert str(error.value) == f"CSV_DELIMITER={value!r} is not allowed: use one of comma, semicolon, tab, pipe"


def test_csv_delimiter_on_a_dataset_that_is_no_csv_is_refused_not_ignored(tmp_path):
    (tmp_path / "rows.jsonl").write_text('{"a": 1, "label": 0}\n')
    for dataset in (str(tmp_path / "rows.jsonl"), "mnist"):
        with pytest.raises(SettingsError) as error:
            load_settings(
                {}, {"DATASET": dataset, "CSV_DELIMITER": "tab"}, Path("/nonexistent/.env"), defaults_path=None
            )
        assert str(error.value) == (
            f"CSV_DELIMITER=tab is set but DATASET={dataset!r} is not a CSV or .tsv file: leave CSV_DELIMITER empty"
        )


def test_a_header_of_one_column_that_holds_another_delimiter_says_which_to_set(tmp_path):
    """The whole header read as one name (CSV_DELIMITER=comma on a tab file) is named as that, with the delimiter
    it holds, not as a label missing from a list of one column."""
    path = tab_file(tmp_path / "anes.csv", votes(6))
    result = run_train("fit", cwd=tmp_path, DATASET=str(path), LABEL_KEY="vote", CSV_DELIMITER="comma",
                       TFDS_DATA_DIR=tmp_path / "tfds", OUTPUT_DIR=tmp_path / "run", **FAST)  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1] == (
        f"error: {path}'s header is one column \"'popul'\\t'TVnews'\\t'selfLR'\\t'vote'\" that holds '\\t': "
        "set CSV_DELIMITER=tab"
    )
    with pytest.raises(SettingsError, match=r"header is one column 'a;b;label' that holds ';': set CSV_DELIMITER=semi"):
        survey_table(tmp_path / "eu.csv", "a;b;label\n1;2;x\n", "pipe")


# --- written, trained, predicted -----------------------------------------------------------------------------------

WRITTEN_NAMES = """
import sys
from train.data import written
from train.settings import load_settings
for delimiter in sys.argv[1:]:
    settings = load_settings({"CSV_DELIMITER": delimiter})
    prepared = written.prepare_path(settings, settings.source, lambda line: None)  # its progress lines: not these
    print(prepared.directory.parent.name, *prepared.notes, sep="|")
"""


def test_the_delimiter_is_part_of_the_written_copys_name(tmp_path):
    """CSV_DELIMITER changed: the copy is written anew under another name (the index of the same files does not
    reuse the other's); set back: the first is reused. The start names how the file was read."""
    (tmp_path / "t.csv").write_text("name,city|label\n" + "".join(f"n{i},c{i % 3}|{'xy'[i % 2]}\n" for i in range(20)))
    env = clean_env(DATASET="./t.csv", TFDS_DATA_DIR=tmp_path / "tfds", LABEL_KEY="none")
    result = run_python(["-c", WRITTEN_NAMES, "pipe", "", "pipe"], cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-2000:]
    piped, sniffed, again = (line.split("|") for line in result.stdout.strip().splitlines()[-3:])
    assert piped[0] != sniffed[0] and again[0] == piped[0]
    assert 't.csv read as pipe-separated, quoted with ", decimal point.' in piped[1:]
    assert again[1:] == piped[1:]  # reused, its notes remembered


@pytest.fixture(scope="module")
def tab_run(tmp_path_factory):
    """A run trained with MODEL unset on a tab-separated file quoted as shipped: (its folder, its answers, fit)."""
    folder = tmp_path_factory.mktemp("tab")
    answers = votes()
    tab_file(folder / "anes.csv", answers)
    result = run_train("fit", cwd=folder, DATASET="./anes.csv", LABEL_KEY="vote", TFDS_DATA_DIR=folder / "tfds",
                       OUTPUT_DIR=folder / "run", **FAST)  # fmt: skip
    return folder, answers, result


def test_a_tab_file_quoted_as_shipped_trains_on_its_label_and_the_start_names_how_it_was_read(tab_run):
    folder, _, result = tab_run
    assert result.returncode == 0, result.stderr[-3000:]
    said = result.stdout + result.stderr
    assert "anes.csv read as tab-separated, quoted with ', decimal point" in said
    features = json.loads((folder / "run" / "run.json").read_text())["features"]
    assert features["label_is_class"]


def test_predict_reads_a_semicolon_input_file_as_the_dataset_is_read(tab_run):
    """The same rows as a `;` file with decimal commas predict what the tab file's rows predict."""
    folder, answers, fit = tab_run
    assert fit.returncode == 0, fit.stderr[-3000:]
    rows = folder / "rows.csv"
    rows.write_text(
        "popul;TVnews;selfLR\n" + "".join(f"{str(p).replace('.', ',')};{t};{s}\n" for p, t, s, _ in answers)
    )
    predicted = {}
    for path in (rows, folder / "anes.csv"):
        result = run_train("predict", "--output-dir", str(folder / "run"), str(path), cwd=folder, MODEL=None)
        assert result.returncode == 0, result.stderr[-2000:]
        predicted[path.name] = [json.loads(line) for line in result.stdout.strip().splitlines()]
    assert len(predicted["rows.csv"]) == len(answers)
    for semicolon, tab in zip(predicted["rows.csv"], predicted["anes.csv"], strict=True):
        assert semicolon["class"] == tab["class"] and semicolon["scores"] == pytest.approx(tab["scores"], abs=1e-6)
