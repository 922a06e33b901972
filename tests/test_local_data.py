"""DATASET as a path: a folder of images, a CSV or JSON Lines file, a prepared TFDS folder. Surveyed and checked
before TensorFlow loads (train/data/local.py), written once as TFDS records (train/data/written.py), its identity
in run.json (train/data/opening.py). Runs that train do it in processes of their own."""

from __future__ import annotations

import json
import os
import shutil
import time
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from tests.conftest import clean_env, read_summary, run_python, run_train
from tests.harness.runs import RESIZED, run_two_workers
from train import dataset_path
from train.data import local, written
from train.dataset_path import is_path
from train.errors import SettingsError
from train.settings import load_settings
from train.tools import prepared

FAST = {"EPOCHS": 1, "BATCH_SIZE": 8, "LOG_EVERY": 1000}


def photos(root: Path, classes=("cat", "dog", "tulip"), per_class: int = 8, seed: int = 0) -> Path:
    """Small images in class folders: JPEGs and PNGs mixed, sizes differing, and a GIF and a BMP."""
    rng = np.random.default_rng(seed)
    for name in classes:
        folder = root / name
        folder.mkdir(parents=True)
        for i in range(per_class):
            pixels = rng.integers(0, 255, (12 + i, 16, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(folder / (f"{i}.png" if i % 3 == 0 else f"{i}.jpg"))
    Image.fromarray(rng.integers(0, 255, (9, 9, 3), dtype=np.uint8)).save(root / classes[0] / "still.gif")
    Image.fromarray(rng.integers(0, 255, (9, 9, 3), dtype=np.uint8)).save(root / classes[-1] / "bitmap.bmp")
    return root


def write_csv(path: Path, rows: int = 120, seed: int = 0) -> Path:
    rng = np.random.default_rng(seed)
    lines = ["age,fare,city,label"]
    for _ in range(rows):
        kind = int(rng.integers(0, 2))
        lines.append(f"{30 + 20 * kind + int(rng.integers(0, 5))},{rng.random() + kind:.3f},c{kind},{'ny'[kind]}")
    path.write_text("\n".join(lines) + "\n")
    return path


# --- the survey and the reading, no TensorFlow -------------------------------------------------------------------


def test_the_layout_is_told_from_the_roots_subfolders(tmp_path):
    flat = photos(tmp_path / "flat")
    (flat / "cat" / "deeper").mkdir()
    shutil.copy(flat / "cat" / "1.jpg", flat / "cat" / "deeper" / "x.jpg")  # inside a class: that class's
    survey = dataset_path.survey(str(flat))
    assert (survey.kind, list(survey.splits), survey.classes) == ("images", ["train"], ("cat", "dog", "tulip"))
    assert ("cat/deeper/x.jpg", "cat") in {(entry.path, label) for entry, label in survey.splits["train"]}

    split = tmp_path / "split"
    photos(split / "train")
    photos(split / "test", per_class=2)
    survey = dataset_path.survey(str(split))
    assert sorted(survey.splits) == ["test", "train"] and survey.classes == ("cat", "dog", "tulip")


def test_dataset_is_a_path_when_it_looks_like_one_or_exists(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "table.csv").write_text("a,label\n1,0\n")
    assert is_path("./x") and is_path("/x") and is_path("~/x") and is_path("../x")
    assert is_path("table.csv") and not is_path("mnist") and not is_path("mnist/config:1.0.0")
    assert is_path("missing.jsonl")  # a table's suffix: a path, refused as missing when surveyed


def test_a_bare_name_is_tfds_s_where_a_builder_has_it_and_the_folder_only_where_none_does(tmp_path, monkeypatch):
    """A folder named like a TFDS dataset here (TFDS wrote it into the working directory, or this is the TFDS data
    directory): the bare name is still TFDS's; `./name` is the folder. A name no builder has is the folder."""
    monkeypatch.chdir(tmp_path)
    for name in ("synthetic_clusters", "mnist", "my_photos"):
        (tmp_path / name).mkdir()
    assert not is_path("synthetic_clusters") and not is_path("mnist")
    assert is_path("./synthetic_clusters") and is_path("my_photos")


def test_columns_are_typed_from_their_values_and_the_label_kind_guessed_or_told(tmp_path):
    path = tmp_path / "t.csv"
    path.write_text("n,x,word,label\n1,0.5,a,yes\n2,1,b,no\n3,2.5,,yes\n")
    table = local.read_table(dataset_path.survey(str(path)), "label", None, local.Read())
    kinds = {column.name: (column.dtype, column.classes) for column in table.columns}
    assert kinds == {"n": ("int64", None), "x": ("float32", None), "word": ("string", None),
                     "label": ("int64", ("no", "yes"))}  # fmt: skip
    assert [row["label"] for row in table.rows["train"]] == [1, 0, 1]

    path.write_text("x,label\n0.5,2\n1.5,0\n")
    guessed = local.read_table(dataset_path.survey(str(path)), "label", None, local.Read()).columns[-1]
    assert guessed.num_classes == 3  # whole numbers from 0: max + 1 classes
    told = local.read_table(dataset_path.survey(str(path)), "label", "value", local.Read()).columns[-1]
    assert (told.dtype, told.num_classes) == ("float32", None)


def test_a_whole_number_label_is_a_value_where_its_classes_would_be_more_than_twice_its_values(tmp_path):
    path = tmp_path / "t.csv"

    def label(rows: str, kind: str | None = None) -> local.Column:
        path.write_text("x,label\n" + rows)
        return local.read_table(dataset_path.survey(str(path)), "label", kind, local.Read()).columns[-1]

    years = "".join(f"{i},{1990 + i % 30}\n" for i in range(60))  # 2,020 classes (0 to 2019) from 30 values
    assert (label(years).dtype, label(years).num_classes) == ("float32", None)
    assert label(years, "class").num_classes == 2020  # LABEL_KIND=class says otherwise
    assert label("".join(f"{i},{1 + i % 5}\n" for i in range(20))).num_classes == 6  # ratings 1-5: 6 from 5 values


@pytest.mark.slow
def test_a_runs_recorded_label_kind_is_read_whatever_the_guess_says(tmp_path, monkeypatch):
    """A run's later start reads a table's label as its run.json records it (here a value, with LABEL_KIND unset,
    where the guess says classes), under the same name: the data is the run's, even written anew."""
    import tensorflow_datasets as tfds

    from train.data.opening import with_run_label_kind

    monkeypatch.chdir(tmp_path)
    (tmp_path / "rates.csv").write_text("x,label\n" + "".join(f"{i},{i % 5}\n" for i in range(40)))
    settings = load_settings(environ={"DATASET": "rates.csv", "TFDS_DATA_DIR": "a"}, dotenv_path=tmp_path / ".env")
    guessed = written.prepare_path(settings, settings.source, print)
    recorded = {"features": {"images": [], "label_is_class": True, "classes": None}}  # a value label's run.json
    elsewhere = settings.replace(tfds_data_dir=tmp_path / "b")  # its copy is not there: written anew
    kept = written.prepare_path(with_run_label_kind(elsewhere, recorded), elsewhere.source, print)
    label = [tfds.builder_from_directory(str(each.directory)).info.features["label"] for each in (guessed, kept)]
    assert isinstance(label[0], tfds.features.ClassLabel) and label[0].num_classes == 5
    assert not isinstance(label[1], tfds.features.ClassLabel) and label[1].dtype.name == "float32"
    assert kept.identity == guessed.identity


REGRESSION = """\
import keras


def build_model(input_shape, num_classes, learning_rate):
    inputs = {name: keras.Input(input_shape[name], name=name) for name in sorted(input_shape)}
    x = keras.layers.Concatenate()([keras.layers.Reshape((1,))(inputs[name]) for name in sorted(inputs)])
    model = keras.Model(inputs, keras.layers.Dense(1)(x))
    model.compile(keras.optimizers.SGD(learning_rate), "mse")
    return model
"""


@pytest.mark.slow
def test_a_resume_reads_the_label_kind_its_run_json_recorded_though_the_guess_says_otherwise(tmp_path):
    """A run that trained on ratings 0-4 as values with LABEL_KIND unset (as a run from before the guess changed
    would have: made so here), resumed where its copy of the data is gone: it is written anew as values."""
    (tmp_path / "model.py").write_text(REGRESSION)
    (tmp_path / "rates.csv").write_text("x,label\n" + "".join(f"{i % 7},{i % 5}\n" for i in range(64)))
    given = {"MODEL": "model.py", "DATASET": "rates.csv", "OUTPUT_DIR": "run", "EPOCHS": 1, "BATCH_SIZE": 16}
    first = run_train("fit", cwd=tmp_path, LABEL_KIND="value", TFDS_DATA_DIR=tmp_path / "a", **given)
    assert first.returncode == 0, first.stderr[-3000:]
    run = tmp_path / "run"
    steps = read_summary(run)["steps"]
    settings, recorded = (json.loads((run / name).read_text()) for name in ("settings.json", "run.json"))
    survey = dataset_path.survey(str(tmp_path / "rates.csv"))
    recorded["data"]["name"] = written._name(survey, recorded["data"]["fingerprint"], "label", None)  # as guessed
    (run / "run.json").write_text(json.dumps(recorded))
    (run / "settings.json").write_text(json.dumps({**settings, "LABEL_KIND": ""}))
    resumed = run_train("fit", cwd=tmp_path, TFDS_DATA_DIR=tmp_path / "b", **{**given, "EPOCHS": 2})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    summary = read_summary(run)
    assert (summary["classes"], summary["resumed_from_step"], summary["epochs_completed"]) == (None, steps, 2)


@pytest.mark.parametrize(
    ("name", "content", "label_key", "says"),
    [
        ("ragged.csv", "a,b,label\n1,2,0\n1,2\n", "label", "ragged.csv line 3 has 2 values, the header 3 columns"),
        ("headless.csv", "1,2,0\n3,4,1\n", "label", "headless.csv has no header row"),
        ("twice.csv", "a,b,a,label\n1,2,3,0\n", "label", "twice.csv's header names the column 'a' 2 times: give"),
        ("keys.csv", "a,b,y\n1,2,0\n", "label", "LABEL_KEY='label' is not a column of"),
        ("huge.csv", "a,label\n1,0\n" + "x" * 200_000 + ",1\n", "label", "huge.csv line 3 is not CSV (field larger"),
        ("nolabel.csv", "a,label\n1,x\n2,\n", "label", "column 'label' is the label but row 3 of train is empty"),
        ("latin.csv", b"a,label\n\xe9,0\n", "label", "latin.csv is not UTF-8 text (line 2)"),
        ("lines.jsonl", '{"a": 1, "label": 0}\n{"a": 2,\n', "label", "lines.jsonl line 2 is not JSON"),
    ],
)
def test_a_bad_table_is_refused_in_one_line_naming_it(tmp_path, name, content, label_key, says):
    path = tmp_path / name
    path.write_bytes(content.encode() if isinstance(content, str) else content)
    with pytest.raises(SettingsError) as error:
        local.read_table(dataset_path.survey(str(path)), label_key, None, local.Read())
    assert says in str(error.value) and "\n" not in str(error.value)
    if name == "keys.csv":
        assert str(error.value).endswith("use one of a, b, y")


def test_the_fingerprint_is_the_files_not_their_path_or_mtime(tmp_path):
    def fingerprint(root: Path) -> str:
        survey, read = dataset_path.survey(str(root)), local.Read()
        for entry, _ in survey.splits["train"]:
            local.read_image(survey, entry, read)
        return read.fingerprint

    first = photos(tmp_path / "a")
    second = tmp_path / "b"
    shutil.copytree(first, second)
    os.utime(second / "cat" / "1.jpg", ns=(1, 1))
    assert fingerprint(first) == fingerprint(second)
    (second / "cat" / "1.jpg").write_bytes((second / "cat" / "2.jpg").read_bytes())
    assert fingerprint(first) != fingerprint(second)


# --- bad paths: one line, exit 2, before the run directory -------------------------------------------------------


def _make_bad(tmp_path: Path, case: str) -> Path:
    root = tmp_path / "data"
    if case == "missing":
        return root
    if case == "no folders":
        root.mkdir()
        (root / "README").write_text("hi")
    elif case == "no images":
        for name in ("cat", "dog"):  # two class folders: one alone is refused first (one class)
            (root / name).mkdir(parents=True)
            (root / name / "notes.txt").write_text("no image here")
    elif case == "empty class":
        photos(root)
        (root / "owl").mkdir()
    elif case == "splits differ":
        photos(root / "train")
        photos(root / "test", classes=("cat", "dog"))
    elif case == "mixed kinds":
        root.mkdir()
        write_csv(root / "train.csv")
        (root / "test.jsonl").write_text('{"a": 1}\n')
    elif case == "not an image":
        photos(root)
        (root / "dog" / "fake.jpg").write_text("not a jpeg")
    return root


@pytest.mark.parametrize(
    ("case", "says"),
    [
        ("missing", "does not exist"),
        ("no folders", "holds no folders"),
        ("no images", "the split train holds no JPEG, PNG, GIF or BMP images"),
        ("empty class", "the class folder owl is empty"),
        ("splits differ", "the splits' class folders differ: test has no tulip"),
        ("mixed kinds", "mixes .csv and .jsonl files"),
        ("not an image", "dog/fake.jpg (named as an image but not a JPEG, PNG, GIF or BMP)"),
    ],
)
def test_a_bad_path_is_one_line_and_exit_2_before_the_run_directory(tmp_path, case, says):
    root = _make_bad(tmp_path, case)
    result = run_train("fit", cwd=tmp_path, DATASET=f"./{root.name}", TFDS_DATA_DIR=tmp_path / "tfds",
                       OUTPUT_DIR=tmp_path / "run", MODEL="examples.resnet", **FAST)  # fmt: skip
    lines = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert result.returncode == 2 and len(lines) == 1 and says in lines[0], result.stderr[-2000:]
    assert "data" in lines[0] and "Traceback" not in result.stderr
    assert not (tmp_path / "run").exists()
    assert not list((tmp_path / "tfds").glob(f"{written.WRITING}*"))  # a refused write leaves nothing


@pytest.mark.parametrize("dataset", ["./photos", "synthetic_clusters"], ids=["a folder", "a bundled dataset"])
def test_a_tfds_data_dir_that_cannot_be_written_is_refused_with_advice(tmp_path, dataset):
    photos(tmp_path / "photos", per_class=2)
    (tmp_path / "file").write_text("a file, not a folder")  # what a read-only mount is to any user, root too
    data_dir = tmp_path / "file" / "tfds"
    result = run_train("fit", cwd=tmp_path, DATASET=dataset, TFDS_DATA_DIR=data_dir, OUTPUT_DIR=tmp_path / "run",
                       MODEL="examples.resnet", **FAST)  # fmt: skip
    assert result.returncode == 2, result.stderr[-2000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: TFDS_DATA_DIR={data_dir} cannot be written") and f"DATASET={dataset!r}" in last
    assert last.endswith("make that folder writable, or set TFDS_DATA_DIR to a writable one")
    assert "network" not in last and not (tmp_path / "run").exists()


# --- written once, trained, checked ------------------------------------------------------------------------------


READ_RECORDS = """
import json, sys, tensorflow as tf, tensorflow_datasets as tfds
builder = tfds.builder_from_directory(sys.argv[1])
spec = {"image": tf.io.FixedLenFeature([], tf.string), "filename": tf.io.FixedLenFeature([], tf.string),
        "label": tf.io.FixedLenFeature([], tf.int64)}
rows = []
for info in builder.info.splits["train"].file_instructions:
    for record in tf.data.TFRecordDataset(info.filename):
        example = tf.io.parse_single_example(record, spec)
        rows.append([example["filename"].numpy().decode(), example["image"].numpy().hex(), int(example["label"])])
print(json.dumps({"rows": rows, "classes": builder.info.features["label"].names,
                  "shape": list(builder.info.features["image"].shape)}))
"""


@pytest.fixture(scope="module")
def trained_folder(tmp_path_factory):
    """A folder of class folders (and a .DS_Store) trained with examples/resnet.py, unchanged."""
    tmp_path = tmp_path_factory.mktemp("folder")
    photos(tmp_path / "photos")
    (tmp_path / "photos" / ".DS_Store").write_bytes(b"\x00\x00\x00\x01Bud1")
    settings = dict(DATASET="./photos", TFDS_DATA_DIR=tmp_path / "tfds", OUTPUT_DIR=tmp_path / "run",
                    MODEL="examples.resnet", **FAST)  # fmt: skip
    result = run_train("fit", cwd=tmp_path, **settings)
    return tmp_path, settings, result


def test_a_folder_of_class_folders_trains_and_keeps_its_class_names(trained_folder):
    tmp_path, _, result = trained_folder
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout + result.stderr
    assert "1 file(s) left out, not a JPEG, PNG, GIF or BMP: .DS_Store" in out
    assert "one split, train: training on train[:90%], evaluating on train[90%:]" in out
    assert "files/s" in out  # the writing's progress
    summary = read_summary(tmp_path / "run")
    assert summary["classes"] == ["cat", "dog", "tulip"] and summary["eval"] is not None
    recorded = json.loads((tmp_path / "run" / "run.json").read_text())["data"]
    assert recorded["kind"] == "images" and recorded["files"] == 26 and len(recorded["fingerprint"]) == 64


def test_the_records_hold_each_files_own_bytes_in_a_mixed_order(trained_folder):
    tmp_path, _, _ = trained_folder
    name = json.loads((tmp_path / "run" / "run.json").read_text())["data"]["name"]
    directory = tmp_path / "tfds" / name / written.VERSION
    result = run_python(["-c", READ_RECORDS, str(directory)])
    assert result.returncode == 0, result.stderr[-2000:]
    read = json.loads(result.stdout.strip().splitlines()[-1])
    assert read["classes"] == ["cat", "dog", "tulip"] and read["shape"] == [None, None, 3]
    files = {str(p.relative_to(tmp_path / "photos")) for p in (tmp_path / "photos").rglob("*") if p.is_file()}
    assert {name for name, _, _ in read["rows"]} == files - {".DS_Store"}
    for name, data, label in read["rows"]:  # byte for byte: no decode, no re-encode
        assert bytes.fromhex(data) == (tmp_path / "photos" / name).read_bytes()
        assert read["classes"][label] == name.split("/")[0]
    labels = [label for _, _, label in read["rows"]]
    assert labels != sorted(labels)  # shuffled by a fixed seed, so that a slice mixes the classes
    assert len(set(labels[:9])) > 1


def test_the_same_files_are_reused_not_written_again(trained_folder, monkeypatch):
    tmp_path, settings, _ = trained_folder
    monkeypatch.chdir(tmp_path)
    for name, value in settings.items():
        monkeypatch.setenv(name, str(value))
    started = time.perf_counter()
    loaded = load_settings()
    reused = written.prepare_path(loaded, loaded.source, lambda line: pytest.fail(f"written again: {line}"))
    print(f"reused in {time.perf_counter() - started:.3f} s")  # a timing is printed, not asserted
    assert reused.identity == json.loads((tmp_path / "run" / "run.json").read_text())["data"]


def test_a_changed_source_or_another_dataset_on_the_run_directory_is_refused(trained_folder):
    tmp_path, settings, _ = trained_folder
    checkpoints = sorted((tmp_path / "run" / "checkpoints").iterdir())
    changed = tmp_path / "changed"
    shutil.copytree(tmp_path / "photos", changed)
    os.rename(tmp_path / "photos", tmp_path / "original")
    os.rename(changed, tmp_path / "photos")
    try:
        shutil.copy(tmp_path / "photos" / "cat" / "1.jpg", tmp_path / "photos" / "dog" / "new.jpg")
        (tmp_path / "photos" / "cat" / "2.jpg").unlink()
        result = run_train("fit", cwd=tmp_path, **{**settings, "EPOCHS": 2})
    finally:
        shutil.rmtree(tmp_path / "photos")
        os.rename(tmp_path / "original", tmp_path / "photos")
    assert result.returncode == 2, result.stderr[-2000:]
    [line] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "DATASET='./photos' has changed since OUTPUT_DIR=" in line
    assert "2 file(s) changed (added dog/new.jpg, removed cat/2.jpg)" in line and "new OUTPUT_DIR" in line
    assert sorted((tmp_path / "run" / "checkpoints").iterdir()) == checkpoints  # nothing trained on it

    other = run_train("fit", cwd=tmp_path, **{**settings, "DATASET": "synthetic_photos", "EPOCHS": 2})
    assert other.returncode == 2, other.stderr[-2000:]
    [line] = [line for line in other.stderr.splitlines() if line.startswith("error:")]
    assert "DATASET='synthetic_photos' is not the data OUTPUT_DIR=" in line and "name 'photos_" in line


def test_an_image_that_does_not_decode_stops_the_run_naming_its_file_and_costs_nothing_once_removed(tmp_path):
    photos(tmp_path / "photos")
    damaged = tmp_path / "photos" / "dog" / "4.jpg"
    data = bytearray(damaged.read_bytes())
    frame = data.find(b"\xff\xc0")
    data[frame + 7 : frame + 9] = b"\x00\x00"  # width 0: whole in structure (it ends with FF D9), undecodable
    damaged.write_bytes(bytes(data))
    settings = dict(cwd=tmp_path, DATASET="./photos", TFDS_DATA_DIR=tmp_path / "tfds", OUTPUT_DIR=tmp_path / "run",
                    MODEL="examples.resnet", **FAST)  # fmt: skip
    result = run_train("fit", **settings)
    assert result.returncode == 1, result.stderr[-3000:]
    [line] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert line.startswith("error: the image dog/4.jpg of DATASET=./photos cannot be decoded (")
    assert "checkpoints/ckpt-0 is intact" in line and "Traceback" not in result.stderr

    damaged.unlink()  # the run trained no step: the same OUTPUT_DIR takes the data as it is now
    fixed = run_train("fit", **settings)
    assert fixed.returncode == 0, fixed.stderr[-3000:]
    assert "but no step was trained on that: this run trains on the data as it is now" in fixed.stdout + fixed.stderr
    assert json.loads((tmp_path / "run" / "run.json").read_text())["data"]["files"] == 25


def test_a_tfds_dataset_prepared_anew_is_not_the_runs_data(tmp_path, tfds_data_dir, sharded_data_dir):
    quick = dict(cwd=tmp_path, OUTPUT_DIR=tmp_path / "run", STEPS_PER_EPOCH=2, EPOCHS=1)
    assert run_train("fit", TFDS_DATA_DIR=tfds_data_dir, **quick).returncode == 0
    recorded = json.loads((tmp_path / "run" / "run.json").read_text())["data"]
    assert (recorded["name"], recorded["version"]) == ("synthetic_clusters", "1.0.0") and recorded["shard_lengths"]
    anew = sharded_data_dir  # the same dataset prepared again, in 4 files
    result = run_train("fit", TFDS_DATA_DIR=anew, **{**quick, "EPOCHS": 2})
    assert result.returncode == 2, result.stderr[-2000:]
    [line] = [line for line in result.stderr.splitlines() if line.startswith("error:")]
    assert "DATASET='synthetic_clusters' is not the data OUTPUT_DIR=" in line
    assert "now {train: 4 files" in line and "it was prepared anew" in line


def test_a_prepared_tfds_folder_is_read_in_place(trained_folder, tmp_path_factory):
    tmp_path, settings, _ = trained_folder
    model = tmp_path_factory.mktemp("model") / "resized.py"  # any model: the reading is what is tested
    model.write_text(RESIZED)
    name = json.loads((tmp_path / "run" / "run.json").read_text())["data"]["name"]
    directory = tmp_path / "tfds" / name / written.VERSION
    prepared = tmp_path / "prepared"
    shutil.copytree(directory, prepared)
    result = run_train("fit", cwd=tmp_path, **{**settings, "DATASET": "./prepared", "OUTPUT_DIR": tmp_path / "p",
                                               "MODEL": model})  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_summary(tmp_path / "p")["classes"] == ["cat", "dog", "tulip"]
    recorded = json.loads((tmp_path / "p" / "run.json").read_text())["data"]
    assert recorded["kind"] == "tfds folder" and recorded["files"] == 2  # dataset_info.json and the record file


def test_a_folder_of_split_folders_trains_on_train_and_evaluates_on_test_streamed_on_two_replicas(tmp_path):
    photos(tmp_path / "photos" / "train")
    photos(tmp_path / "photos" / "test", per_class=3, seed=1)
    (tmp_path / "resized.py").write_text(RESIZED)  # any model: the layout and the streaming are what is tested
    result = run_train("fit", cwd=tmp_path, DATASET="./photos", TFDS_DATA_DIR=tmp_path / "tfds",
                       OUTPUT_DIR=tmp_path / "run", MODEL="resized.py", DATA_IN_MEMORY="false", CPU_DEVICES=2,
                       **FAST)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert "one split" not in result.stdout + result.stderr
    settings = json.loads((tmp_path / "run" / "settings.json").read_text())
    assert (settings["TRAIN_SPLIT"], settings["EVAL_SPLIT"]) == ("train", "test")
    summary = read_summary(tmp_path / "run")
    assert (summary["replicas"], summary["data_in_memory"]) == (2, False)


@pytest.mark.slow
def test_a_run_on_a_folder_resumed_ends_with_the_uninterrupted_runs_weights(trained_folder, tmp_path):
    """The shared run (1 epoch, ended) resumed on a copy to 2 epochs; the uninterrupted run trains 2 at once, on the
    copy's folder and TFDS_DATA_DIR, with the same settings."""
    shared, settings, _ = trained_folder
    for name in ("photos", "tfds", "run"):
        shutil.copytree(shared / name, tmp_path / name)
    common = {**settings, "TFDS_DATA_DIR": tmp_path / "tfds", "EPOCHS": 2}
    whole = run_train("fit", cwd=tmp_path, **{**common, "OUTPUT_DIR": tmp_path / "whole"})
    assert whole.returncode == 0, whole.stderr[-3000:]
    resumed = run_train("fit", cwd=tmp_path, **{**common, "OUTPUT_DIR": tmp_path / "run"})
    assert resumed.returncode == 0, resumed.stderr[-3000:]
    whole, cut = read_summary(tmp_path / "whole"), read_summary(tmp_path / "run")
    assert cut["resumed_from_step"] == whole["steps"] // 2
    assert cut["weights_sha256"] == whole["weights_sha256"]


def test_a_csv_with_text_and_number_columns_and_a_text_label_trains_with_preprocess(tmp_path):
    write_csv(tmp_path / "table.csv")
    (tmp_path / "model.py").write_text(
        "import keras, tensorflow as tf\n"
        "def preprocess(example, training, seed):\n"
        "    city = tf.cast(example['city'] == 'c1', tf.float32)\n"
        "    return tf.stack([tf.cast(example['age'], tf.float32) / 50, example['fare'], city]), example['label']\n"
        "def build_model(input_shape, num_classes, learning_rate):\n"
        "    dense = keras.layers.Dense(num_classes, activation='softmax')\n"
        "    model = keras.Sequential([keras.Input(input_shape), dense])\n"
        "    model.compile(optimizer='adam', loss='sparse_categorical_crossentropy', metrics=['accuracy'])\n"
        "    return model\n"
    )
    result = run_train("fit", cwd=tmp_path, DATASET="table.csv", TFDS_DATA_DIR=tmp_path / "tfds",
                       OUTPUT_DIR=tmp_path / "run", MODEL="model.py", **FAST)  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_summary(tmp_path / "run")["classes"] == ["n", "y"]


def test_a_json_lines_file_of_numbers_trains_with_examples_tabular_and_a_text_column_is_refused(tmp_path):
    rng = np.random.default_rng(0)
    rows = [
        {"x": float(rng.random()) + k, "n": int(rng.integers(0, 9)), "label": k}
        for k in rng.integers(0, 2, 80).tolist()
    ]
    (tmp_path / "rows.jsonl").write_text("".join(json.dumps(row) + "\n" for row in rows))
    common = dict(TFDS_DATA_DIR=tmp_path / "tfds", MODEL="examples.tabular", **FAST)
    result = run_train("fit", cwd=tmp_path, DATASET="./rows.jsonl", OUTPUT_DIR=tmp_path / "run", **common)
    assert result.returncode == 0, result.stderr[-3000:]
    assert read_summary(tmp_path / "run")["classes"] == ["0", "1"]

    write_csv(tmp_path / "table.csv")
    refused = run_train("fit", cwd=tmp_path, DATASET="./table.csv", OUTPUT_DIR=tmp_path / "text", **common)
    assert refused.returncode == 2 and not (tmp_path / "text").exists()
    assert "the column 'city' holds text" in refused.stderr and "define preprocess" in refused.stderr


def test_a_killed_writings_leftovers_are_removed_under_the_lock(tmp_path):
    photos(tmp_path / "photos", per_class=4)
    data_dir = tmp_path / "tfds"
    (data_dir / f"{written.WRITING}4242" / "1.0.0").mkdir(parents=True)
    incomplete = data_dir / "synthetic_clusters" / "incomplete.abc123_1.0.0"
    incomplete.mkdir(parents=True)
    (incomplete / "synthetic_clusters-train.tfrecord-00000-of-00001").write_bytes(b"x" * 1000)
    (tmp_path / "resized.py").write_text(RESIZED)  # any model: the writing is what is tested
    run = run_train("fit", cwd=tmp_path, DATASET="./photos", TFDS_DATA_DIR=data_dir, OUTPUT_DIR=tmp_path / "run",
                    MODEL="resized.py", **FAST)  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert not (data_dir / f"{written.WRITING}4242").exists()
    prepared = run_train("fit", cwd=tmp_path, TFDS_DATA_DIR=data_dir, OUTPUT_DIR=tmp_path / "clusters",
                         STEPS_PER_EPOCH=2, EPOCHS=1)  # fmt: skip
    assert prepared.returncode == 0, prepared.stderr[-3000:]
    assert not incomplete.exists() and (data_dir / "synthetic_clusters" / "1.0.0" / "dataset_info.json").is_file()


PHOTOS_BUILDER = """from pathlib import Path

import tensorflow_datasets as tfds


class MyPhotos(tfds.ImageFolder):  # registered as my_photos; its images in ../pictures, no folder of that name
    def __init__(self, **kwargs):
        super().__init__(root_dir=str(Path(__file__).parent.parent / "pictures"))
"""


def test_a_registered_image_folder_builder_trains_by_its_name_and_its_folder_changed_is_refused(tmp_path):
    """A fork's tfds.ImageFolder in project/datasets (imported from the working directory, as the engine imports a
    fork's), named by its registered name: its folder is written once as a folder path is; run.json records the
    builder's name and the copy's fingerprint, so fit, its resume, evaluate and predict take it, and a file added
    to its folder is refused."""
    photos(tmp_path / "pictures" / "train", per_class=4)
    photos(tmp_path / "pictures" / "test", per_class=2)
    (tmp_path / "project").mkdir()
    (tmp_path / "project" / "__init__.py").write_text("")
    (tmp_path / "project" / "datasets.py").write_text(PHOTOS_BUILDER)
    (tmp_path / "resized.py").write_text(RESIZED)
    data_dir, run = tmp_path / "tfds", tmp_path / "run"
    settings = dict(DATASET="my_photos", MODEL="resized.py", TFDS_DATA_DIR=data_dir, OUTPUT_DIR=run,
                    STEPS_PER_EPOCH=2, **{**FAST, "BATCH_SIZE": 4})  # fmt: skip
    trained = run_train("fit", cwd=tmp_path, **settings)
    assert trained.returncode == 0, trained.stderr[-3000:]
    data = json.loads((run / "run.json").read_text())["data"]
    assert (data["kind"], data["name"], data["files"]) == ("tfds", "my_photos", 22), data  # 14 + 8 images
    assert (data_dir / data["written"] / written.VERSION / "dataset_info.json").is_file()
    assert prepared.runs_using(tmp_path, pytest.fail) == {f"{data['written']}/{written.VERSION}": [run]}  # kept

    resumed = run_train("fit", cwd=tmp_path, **{**settings, "EPOCHS": 2})
    assert resumed.returncode == 0 and "Traceback" not in resumed.stderr, resumed.stderr[-3000:]
    assert read_summary(run)["resumed_from_step"] == 2
    evaluated = run_train("evaluate", "--output-dir", str(run), cwd=tmp_path, MODEL=None, TFDS_DATA_DIR=data_dir)
    assert evaluated.returncode == 0, evaluated.stderr[-3000:]
    output = tmp_path / "predictions.jsonl"
    predicted = run_train("predict", "--output-dir", str(run), str(tmp_path / "pictures" / "test" / "dog" / "1.jpg"),
                          "--split", "test", "--output", str(output), cwd=tmp_path, MODEL=None,
                          TFDS_DATA_DIR=data_dir)  # fmt: skip
    assert predicted.returncode == 0, predicted.stderr[-3000:]
    lines = [json.loads(line) for line in output.read_text().splitlines()]
    assert len(lines) == 1 + 8 and {line["class"] for line in lines} <= {"cat", "dog", "tulip"}

    shutil.copy(tmp_path / "pictures" / "train" / "cat" / "1.jpg", tmp_path / "pictures" / "train" / "cat" / "new.jpg")
    refused = run_train("fit", cwd=tmp_path, **{**settings, "EPOCHS": 3})
    assert refused.returncode == 2 and "Traceback" not in refused.stderr, refused.stderr[-3000:]
    last = refused.stderr.strip().splitlines()[-1]
    assert "DATASET='my_photos' has changed since" in last and "added train/cat/new.jpg" in last, last


TRANSLATE_FOLDER = """
import sys, tensorflow_datasets as tfds
from train.data.opening import image_folder_root
from train.errors import SettingsError
from train.settings import load_settings
try:
    image_folder_root(tfds.TranslateFolder(sys.argv[1]), load_settings().dataset)
except SettingsError as error:
    print(error)
"""


def test_a_builder_read_without_prepared_files_that_is_no_image_folder_is_refused(tmp_path):
    (tmp_path / "texts").mkdir()
    for name in ("en.train.txt", "de.train.txt"):
        (tmp_path / "texts" / name).write_text("one\n")
    result = run_python(["-c", TRANSLATE_FOLDER, str(tmp_path / "texts")], cwd=tmp_path,
                        env=clean_env(DATASET="my_texts"))  # fmt: skip
    assert result.returncode == 0, result.stderr[-2000:]
    last = result.stdout.strip().splitlines()[-1]
    assert last.startswith("DATASET='my_texts' is a TranslateFolder") and "only a tfds.ImageFolder" in last, last


WORKER_SETTINGS = {"MODEL": "resized.py", "STEPS_PER_EPOCH": 2, "EPOCHS": 1, "BATCH_SIZE": 4,
                   "STRATEGY": "multi_worker", "WORKER_START_TIMEOUT": 60}  # fmt: skip


@pytest.mark.slow
def test_workers_write_a_shared_folder_once_and_compare_the_datas_fingerprint_not_its_path(tmp_path):
    """Two workers sharing TFDS_DATA_DIR; then each with its own copy of the folder at its own path and its own
    TFDS_DATA_DIR (nothing shared): the same files agree, a changed copy is refused."""

    def workers(names: tuple[str, str]) -> list[tuple[int, str]]:
        own = [{"DATASET": tmp_path / name / "photos", "TFDS_DATA_DIR": tmp_path / name / "tfds"} for name in names]
        return run_two_workers(tmp_path, tmp_path, timeout=180, each=own,
                               OUTPUT_DIR=tmp_path / f"run-{'-'.join(names)}", **WORKER_SETTINGS)  # fmt: skip

    (tmp_path / "resized.py").write_text(RESIZED)  # examples/resnet.py's BatchNormalization: see the report
    for name in ("a", "b", "c"):
        photos(tmp_path / name / "photos")
    changed = tmp_path / "c" / "photos" / "cat"
    (changed / "1.jpg").write_bytes((changed / "2.jpg").read_bytes())
    shared = workers(("a", "a"))  # one TFDS_DATA_DIR: written once, under its lock
    assert [code for code, _ in shared] == [0, 0], shared[0][1][-3000:]
    assert len(list((tmp_path / "a" / "tfds").glob("photos_*"))) == 1
    assert sum("Writing " in log for _, log in shared) == 1
    agreed = workers(("a", "b"))
    assert [code for code, _ in agreed] == [0, 0], agreed[0][1][-3000:]
    refused = workers(("a", "c"))
    assert [code for code, _ in refused] == [2, 2], refused[1][1][-3000:]
    last = refused[1][1].strip().splitlines()[-1]
    assert last.startswith("error: worker 1 does not match the chief: data images sha256 ")


def test_the_forks_contract_test_takes_a_folder_as_its_dataset(tmp_path):
    """tests/harness/contract.py (what tests/test_project.py runs on a fork's defaults) with DATASET a folder."""
    photos(tmp_path / "photos", per_class=3)
    (tmp_path / "resized.py").write_text(RESIZED)  # any model: the folder as the dataset is what is tested
    env = clean_env(DATASET=tmp_path / "photos", TFDS_DATA_DIR=tmp_path / "tfds", MODEL=tmp_path / "resized.py")
    result = run_python(["-m", "tests.harness.contract", str(tmp_path / "export")], cwd=tmp_path, env=env)
    assert result.returncode == 0, result.stderr[-3000:]
    outcome = json.loads(result.stdout.strip().splitlines()[-1])
    assert outcome["loss_finite"] and outcome["dataset"].startswith("photos_") and outcome["served_shape"] == [8, 3]


ORDER_MODEL = """
import json, keras, os
{preprocess}
def build_model(input_shape, num_classes, learning_rate):
    with open(os.environ["ORDER_FILE"], "a") as out:  # the order build_model meets the columns in
        out.write(json.dumps(list(input_shape)) + "\\n")
    inputs = {{name: keras.Input(shape, name=name) for name, shape in input_shape.items()}}
    joined = keras.layers.Concatenate()([keras.ops.cast(keras.ops.reshape(x, (-1, 1)), "float32")
                                         for x in inputs.values()])  # in input_shape's order, as examples/tabular
    model = keras.Model(inputs, keras.layers.Dense(num_classes, activation="softmax")(joined))
    model.compile(optimizer="adam", loss="sparse_categorical_crossentropy")
    return model
"""
OWN_PREPROCESS = """
def preprocess(example, training, seed):  # the example's own order: as the files give it
    return {name: value for name, value in example.items() if name != "label"}, example["label"]
"""


def test_a_tables_columns_reach_build_model_in_name_order_with_or_without_preprocess(tmp_path):
    """TFDS gives a prepared table's columns in another order in each process: a model built by iterating
    input_shape would meet other columns after a restart. Six columns: any other order is the files' (1 in 720)."""
    rng = np.random.default_rng(0)
    names = ["zeta", "alpha", "mu", "beta", "omega", "kappa"]
    rows = [",".join([*names, "label"])]
    rows += [",".join([*(f"{value:.3f}" for value in rng.random(6)), str(i % 2)]) for i in range(60)]
    (tmp_path / "table.csv").write_text("\n".join(rows) + "\n")
    for preprocess in ("", OWN_PREPROCESS):
        (tmp_path / "model.py").write_text(ORDER_MODEL.format(preprocess=preprocess))
        output_dir = tmp_path / f"run{len(preprocess)}"
        result = run_train("fit", cwd=tmp_path, DATASET="table.csv", TFDS_DATA_DIR=tmp_path / "tfds", MODEL="model.py",
                           OUTPUT_DIR=output_dir, ORDER_FILE=tmp_path / "order.jsonl", **FAST)  # fmt: skip
        assert result.returncode == 0, result.stderr[-3000:]
    orders = [json.loads(line) for line in (tmp_path / "order.jsonl").read_text().splitlines()]
    assert orders and all(order == sorted(names) for order in orders), orders


def test_a_column_name_the_export_cannot_take_is_refused_before_the_first_step(tmp_path):
    """TensorFlow names a SavedModel's inputs by its op names: a column "sepal length" would fail only when the
    export is written, after the training."""
    rows = ["sepal length,width,label", *(f"{i % 7 / 7:.3f},{i % 5 / 5:.3f},{i % 2}" for i in range(40))]
    (tmp_path / "iris.csv").write_text("\n".join(rows) + "\n")
    result = run_train("fit", cwd=tmp_path, DATASET="iris.csv", TFDS_DATA_DIR=tmp_path / "tfds",
                       OUTPUT_DIR=tmp_path / "run", **FAST)  # fmt: skip
    assert result.returncode == 2, result.stderr[-3000:]
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith("error: DATASET='iris.csv' with MODEL=") and "input named 'sepal length'" in last, last
    assert "Traceback" not in result.stderr and "This is a bug" not in result.stderr
    assert not (tmp_path / "run").exists()  # nothing written
