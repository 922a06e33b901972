"""`python -m train predict` on what a user has: image files and folders, CSV and JSON Lines rows, a split; each
line checked against the run's SavedModel fed the same examples directly; and the export's named outputs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import run_python, run_train

# The examples, each trained briefly: the kind of input and of label each covers (`data`: the TFDS data dir's
# fixture); `INPUTS` says which inputs each is given.
RUNS = {
    "image": {"MODEL": "examples.cnn", "DATASET": "synthetic_images", "TRAIN_SPLIT": "train[:64]",
              "EVAL_SPLIT": "test[:32]", "BATCH_SIZE": 32, "data": "examples_data_dir"},
    "photos": {"MODEL": "examples.resnet", "DATASET": "synthetic_photos", "TRAIN_SPLIT": "train[:32]",
               "EVAL_SPLIT": "test[:16]", "BATCH_SIZE": 16, "data": "photos_data_dir"},
    "tabular": {"MODEL": "examples.tabular", "DATASET": "synthetic_columns", "TRAIN_SPLIT": "train[:256]",
                "EVAL_SPLIT": "test[:64]", "BATCH_SIZE": 64, "data": "photos_data_dir"},
    "regression": {"MODEL": "examples.regression", "DATASET": "synthetic_values", "TRAIN_SPLIT": "train[:256]",
                   "EVAL_SPLIT": "test[:64]", "BATCH_SIZE": 64, "data": "examples_data_dir"},
    "text": {"MODEL": "examples.text", "DATASET": "synthetic_reviews", "TRAIN_SPLIT": "train[:256]",
             "EVAL_SPLIT": "test[:64]", "BATCH_SIZE": 64, "data": "text_data_dir"},
    "multilabel": {"MODEL": "examples.multilabel", "DATASET": "synthetic_tags", "TRAIN_SPLIT": "train[:256]",
                   "EVAL_SPLIT": "test[:64]", "BATCH_SIZE": 64, "data": "examples_data_dir"},
    "gan": {"MODEL": "examples.gan", "DATASET": "synthetic_images", "TRAIN_SPLIT": "train[:64]",
            "BATCH_SIZE": 32, "data": "examples_data_dir"},  # export_model: its generator is exported
}  # fmt: skip
INPUTS = {  # what each is given, all in one predict call: files are written from the test split's first examples
    "image": ("folder", "file", "split"),
    "photos": ("folder", "split"),
    "tabular": ("csv", "jsonl", "split"),
    "regression": ("jsonl", "split"),
    "multilabel": ("csv", "split"),
    "text": ("csv", "jsonl", "split"),  # the text as strings, by its feature's name
}
EXAMPLES = 7  # per input: fewer than --batch 4 x 2, so batches are full and partial


@pytest.fixture(scope="module")
def runs(request, tmp_path_factory) -> dict[str, tuple[Path, Path]]:
    """kind -> (run directory, TFDS data dir), trained once per module, on demand."""
    trained: dict[str, tuple[Path, Path]] = {}

    def get(kind: str) -> tuple[Path, Path]:
        if kind not in trained:
            settings = dict(RUNS[kind])
            data_dir = request.getfixturevalue(settings.pop("data"))
            run = tmp_path_factory.mktemp(kind) / "run"
            result = run_train("fit", cwd=run.parent, OUTPUT_DIR=run, TFDS_DATA_DIR=data_dir, EPOCHS=1, **settings)
            assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-3000:]
            trained[kind] = run, data_dir
        return trained[kind]

    return get


# Writes the test split's first examples as a user has them (image files, in class folders; CSV and JSON Lines rows
# of every stored column, the label among them) and prints what serving_default gives for the same examples fed
# directly: the top class's name, the classes above 0.5, or the value. The files' paths are listed in the order
# `predict` reads them: a folder's sorted, then each file given.
REFERENCE = """
import csv, json, sys
from pathlib import Path
import numpy as np, tensorflow as tf, tensorflow_datasets as tfds
data_dir, name, run, folder, count, kinds = sys.argv[1:7]
folder, count, kinds = Path(folder), int(count), kinds.split(",")
serve = tf.saved_model.load(f"{run}/saved_model").signatures["serving_default"]
inputs = serve.structured_input_signature[1]
builder = tfds.builder(name, data_dir=data_dir)
features = builder.info.features
images = [key for key in inputs if key in features and isinstance(features[key], tfds.features.Image)]
skip = {key: tfds.decode.SkipDecoding() for key in images if inputs[key].dtype == tf.string}
split = f"test[:{count}]"
stored = list(tfds.as_numpy(builder.as_dataset(split=split, shuffle_files=False, decoders=skip or None)))
def column(example, key):
    if key in example:
        return example[key]
    return next(value[key] for value in example.values() if isinstance(value, dict) and key in value)
sent = {key: tf.constant(np.stack([column(e, key) for e in stored])) for key in inputs}
outputs = {key: value.numpy() for key, value in serve(**sent).items()}
if "classes" in outputs:
    names = [[c.decode() for c in row] for row in outputs["classes"]]
    top = [row[int(np.argmax(scores))] for row, scores in zip(names, outputs["scores"])]
    above = [[c for c, s in zip(row, scores) if s > 0.5] for row, scores in zip(names, outputs["scores"])]
    expected = {"class": top, "labels": above}
else:
    expected = {"prediction": outputs["outputs"].tolist()}
files = {}
if "folder" in kinds or "file" in kinds:
    (key,) = images
    paths = []
    for index, example in enumerate(stored):
        data = example[key] if skip else tf.io.encode_png(example[key]).numpy()
        path = folder / "images" / str(index % 3) / f"{index:03d}.{'jpg' if skip else 'png'}"
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        paths.append(path)
    files["folder"] = str(folder / "images")
    files["in_folder"] = [str(p) for p in sorted(paths)]
    files["order"] = [paths.index(p) for p in sorted(paths)]
    files["file"] = str(paths[0])
plain = lambda value: value.decode() if isinstance(value, bytes) else value.tolist()
wanted = bool({"csv", "jsonl"} & set(kinds))  # (rows of images' bytes are not text)
rows = [{key: plain(column(e, key)) for key in inputs} | {"label": 1} for e in stored] if wanted else []
if "csv" in kinds:
    with open(folder / "rows.csv", "w", newline="") as stream:
        writer = csv.DictWriter(stream, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: json.dumps(v) if isinstance(v, list | float) else v for k, v in row.items()})
    files["csv"] = str(folder / "rows.csv")
if "jsonl" in kinds:
    (folder / "rows.jsonl").write_text("".join(json.dumps(row) + "\\n" for row in rows))
    files["jsonl"] = str(folder / "rows.jsonl")
print(json.dumps({"expected": expected, "files": files, "split": split}))
"""


def reference(runs, kind: str, folder: Path) -> dict:
    run, data_dir = runs(kind)
    argv = ["-c", REFERENCE, str(data_dir), RUNS[kind]["DATASET"], str(run), str(folder), str(EXAMPLES)]
    result = run_python([*argv, ",".join(INPUTS[kind])])
    assert result.returncode == 0, result.stderr[-3000:]
    return json.loads(result.stdout.strip().splitlines()[-1])


def predict(run: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    return run_train("predict", "--output-dir", str(run), *args, cwd=cwd, MODEL=None)


def expected_lines(made: dict, kinds: tuple[str, ...]) -> tuple[list[str], list[int]]:
    """The "input" of each line predict writes for these inputs, and which stored example each is."""
    inputs, examples = [], []
    for kind in kinds:
        if kind == "folder":
            inputs += made["files"]["in_folder"]
            examples += made["files"]["order"]
        elif kind == "file":
            inputs.append(made["files"]["file"])
            examples.append(0)
        elif kind == "split":
            inputs += [f"{made['split']}[{index}]" for index in range(EXAMPLES)]
            examples += range(EXAMPLES)
        else:  # rows: the CSV's first row is on line 2, after its header
            first = 2 if kind == "csv" else 1
            inputs += [f"{made['files'][kind]}:{first + index}" for index in range(EXAMPLES)]
            examples += range(EXAMPLES)
    return inputs, examples


KINDS = [pytest.param(kind, marks=[pytest.mark.slow] if kind == "photos" else []) for kind in INPUTS]  # a ResNet


@pytest.mark.parametrize("kind", KINDS)
def test_predict_gives_each_example_what_the_saved_model_gives_it_in_input_order(kind, runs, tmp_path):
    made = reference(runs, kind, tmp_path)
    run, _ = runs(kind)
    args = [made["files"][k] for k in INPUTS[kind] if k != "split"]
    args += ["--split", made["split"]] if "split" in INPUTS[kind] else []
    result = predict(run, *args, "--batch", "4", cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in result.stdout.splitlines()]
    inputs, examples = expected_lines(made, INPUTS[kind])
    assert [line["input"] for line in lines] == inputs
    expected = made["expected"]
    for line, example in zip(lines, examples, strict=True):
        if "prediction" in expected:
            assert set(line) == {"input", "prediction"}
            assert line["prediction"] == pytest.approx(expected["prediction"][example], rel=1e-5, abs=1e-6)
        elif kind == "multilabel":
            assert set(line) == {"input", "labels", "scores"} and len(line["scores"]) == 5
            assert line["labels"] == expected["labels"][example]
        else:
            assert set(line) == {"input", "class", "score", "scores"}
            assert line["class"] == expected["class"][example]
            assert line["score"] == max(line["scores"].values())
            assert sum(line["scores"].values()) == pytest.approx(1.0, abs=1e-4)  # probabilities


def test_the_class_names_are_the_datasets_and_the_checkpoint_predicts_as_the_export(runs, tmp_path):
    made = reference(runs, "tabular", tmp_path)
    run, _ = runs("tabular")
    exported = predict(run, made["files"]["csv"], cwd=tmp_path)
    from_checkpoint = predict(run, made["files"]["csv"], "--checkpoint", "--output", str(tmp_path / "p.jsonl"),
                              cwd=tmp_path)  # fmt: skip
    assert exported.returncode == from_checkpoint.returncode == 0, exported.stderr[-2000:] + from_checkpoint.stderr
    lines = [json.loads(line) for line in exported.stdout.splitlines()]
    assert set(lines[0]["scores"]) == {"died", "survived"}  # synthetic_columns's ClassLabel names
    written = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert [line["class"] for line in written] == [line["class"] for line in lines]
    assert [line["score"] for line in written] == pytest.approx([line["score"] for line in lines], abs=1e-5)
    assert from_checkpoint.stdout == ""


def saved_model_cli(saved_model: Path) -> str:
    """`saved_model_cli show --all`: the console script's own module and main, forked from the test server (which
    has imported TensorFlow already) rather than a new interpreter importing it again."""
    module = "tensorflow.python.tools.saved_model_cli"
    result = run_python(["-m", module, "show", "--dir", str(saved_model), "--all"], timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout


def signature_outputs(shown: str, signature: str) -> dict[str, tuple[str, str]]:
    """{output name: (dtype, shape)} of one signature, as `saved_model_cli show --all` lists it."""
    section = shown.split(f"signature_def['{signature}']:")[1].split("signature_def[")[0]
    outputs = section.split("contains the following output(s):")[1]
    found = {}
    for block in outputs.split("outputs['")[1:]:
        name = block.split("'")[0]
        dtype = block.split("dtype: ")[1].split()[0]
        shape = block.split("shape: ")[1].split("\n")[0]
        found[name] = (dtype, shape)
    return found


def test_the_export_names_its_outputs_as_tf_serving_does(runs):
    image = saved_model_cli(runs("image")[0] / "saved_model")
    assert signature_outputs(image, "serving_default") == {"scores": ("DT_FLOAT", "(-1, 10)"),
                                                           "classes": ("DT_STRING", "(-1, 10)")}  # fmt: skip
    multilabel = saved_model_cli(runs("multilabel")[0] / "saved_model")
    assert signature_outputs(multilabel, "serving_default") == {"scores": ("DT_FLOAT", "(-1, 5)"),
                                                                "classes": ("DT_STRING", "(-1, 5)")}  # fmt: skip
    regression = saved_model_cli(runs("regression")[0] / "saved_model")
    assert signature_outputs(regression, "serving_default") == {"outputs": ("DT_FLOAT", "(-1)")}


def test_a_model_exported_in_place_names_its_outputs_as_its_own_and_predict_gives_them(runs, tmp_path):
    """The GAN's generator (export_model's), latent vectors in, images out: not one score per class, so under
    its own output name (its last layer's), not output_0; predict writes them under that name."""
    run, _ = runs("gan")
    shown = saved_model_cli(run / "saved_model")
    assert signature_outputs(shown, "serving_default") == {"images": ("DT_FLOAT", "(-1, 32, 32, 3)")}
    (tmp_path / "latent.jsonl").write_text("".join(json.dumps({"latent": [0.1 * i] * 16}) + "\n" for i in range(3)))
    result = predict(run, str(tmp_path / "latent.jsonl"), "--output", str(tmp_path / "p.jsonl"), cwd=tmp_path)
    assert result.returncode == 0, result.stderr[-3000:]
    lines = [json.loads(line) for line in (tmp_path / "p.jsonl").read_text().splitlines()]
    assert len(lines) == 3 and set(lines[0]) == {"input", "images"}
    assert [len(lines[0]["images"]), len(lines[0]["images"][0]), len(lines[0]["images"][0][0])] == [32, 32, 3]
    split = predict(run, "--split", "test[:2]", cwd=tmp_path)  # the split stores images, the generator takes latents
    assert split.returncode == 2 and "Traceback" not in split.stderr, split.stderr
    assert split.stderr.strip().splitlines()[-1].endswith("the model takes 'latent', which the dataset does not store")


@pytest.mark.slow
def test_serve_inputs_names_its_outputs_as_serving_default_does(runs):
    photos = saved_model_cli(runs("photos")[0] / "saved_model")  # serve_inputs (preprocess's output) returns the same
    for signature in ("serving_default", "serve_inputs"):
        assert set(signature_outputs(photos, signature)) == {"scores", "classes"}, signature


def test_a_text_file_for_an_image_model_is_one_line_exit_2_and_nothing_is_written(runs, tmp_path):
    run, _ = runs("image")
    made = reference(runs, "image", tmp_path)
    fake = tmp_path / "fake.png"
    fake.write_text("not an image\n")
    output = tmp_path / "out.jsonl"
    result = predict(run, made["files"]["file"], str(fake), "--output", str(output), cwd=tmp_path)
    assert result.returncode == 2, result.stderr[-2000:]
    assert result.stderr.strip().splitlines()[-1].startswith(f"error: {fake}: {fake} is not an image")
    assert not output.exists() and result.stdout == ""
    notes = tmp_path / "notes.txt"
    notes.write_text("a note\n")
    result = predict(run, str(notes), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: INPUT {notes} is none of what predict takes: image files (JPEG, PNG, GIF, BMP) or folders of them, "
        "CSV (.csv, .tsv) or JSON Lines (.jsonl) files"
    ]  # before TensorFlow loads: its start-up lines are not printed either


def test_a_row_missing_a_column_names_its_file_and_line(runs, tmp_path):
    run, _ = runs("tabular")
    rows = tmp_path / "rows.jsonl"
    complete = {"age": 30.0, "fare": 10.0, "pclass": 1, "sex": 0, "position": [1.0, 2.0]}
    rows.write_text(json.dumps(complete) + "\n" + json.dumps({k: v for k, v in complete.items() if k != "fare"}) + "\n")
    rows.with_name("fine.jsonl").write_text(json.dumps(complete) + "\n")
    result = predict(run, str(rows), cwd=tmp_path)
    assert result.returncode == 2 and result.stdout == ""
    last = result.stderr.strip().splitlines()[-1]
    assert last.startswith(f"error: {rows}:2: no column 'fare', which the model takes")
    bad = tmp_path / "bad.csv"
    bad.write_text('age,fare,pclass,sex,position\n30,ten,1,0,"[1, 2]"\n')
    result = predict(run, str(bad), cwd=tmp_path)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1] == f"error: {bad}:2: column 'fare' is 'ten', not a float32"
    output = tmp_path / "out.jsonl"  # a split the dataset lacks, after rows that are fine: nothing written
    result = predict(run, str(rows.with_name("fine.jsonl")), "--split", "valid", "--output", str(output), cwd=tmp_path)
    assert result.returncode == 2 and not output.exists()
    assert result.stderr.strip().splitlines()[-1].startswith("error: --split 'valid' of DATASET=synthetic_columns")


def test_a_run_without_an_export_is_one_line_before_tensorflow_loads(tmp_path):
    result = run_train("predict", "--output-dir", str(tmp_path / "run"), "rows.csv", cwd=tmp_path, MODEL=None,
                       fresh=True)  # fmt: skip
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"error: OUTPUT_DIR={tmp_path / 'run'} has no saved_model/ export: run fit to its end (it exports there), "
        "or predict --checkpoint with the latest checkpoint"
    ]


# train.outputs on models of each kind, in a process of its own: what each signature returns under which name.
NAMED = """
import json
import keras, numpy as np, tensorflow as tf
from train.data.spec import DatasetSpec
from train.outputs import name_outputs

def spec(label_shape, num_classes, names=None):
    return DatasetSpec(name="d", feature_key="x", label_key="y", feature_shape=(3,), feature_dtype="float32",
                       is_image=False, label_shape=label_shape, label_dtype="int64", num_classes=num_classes,
                       train_examples=0, eval_examples=0, classes=names)

def model(outputs, loss):
    inputs = keras.Input((3,), name="x")
    made = keras.Model(inputs, outputs(inputs))
    made.compile(optimizer="adam", loss=loss)
    return made

x = tf.constant(np.random.default_rng(0).normal(size=(4, 3)), tf.float32)
cases = {
    "logits": (model(lambda i: keras.layers.Dense(3)(i), keras.losses.SparseCategoricalCrossentropy(from_logits=True)),
               spec((), 3, ["cat", "dog", "owl"])),
    "multi-hot logits": (model(lambda i: keras.layers.Dense(2)(i), keras.losses.BinaryCrossentropy(from_logits=True)),
                         spec((2,), 2)),
    "one unit": (model(lambda i: keras.layers.Dense(1, activation="sigmoid", name="p")(i), "binary_crossentropy"),
                 spec((), 2)),
    "value": (model(lambda i: keras.layers.Dense(1)(i), "mse"), spec((), None)),
    "two outputs": (model(lambda i: {"a": keras.layers.Dense(3)(i), "b": keras.layers.Dense(1)(i)}, "mse"),
                    spec((), 3)),
}
found = {}
for name, (made, data) in cases.items():
    outputs = name_outputs(made, data)(made(x))
    found[name] = {key: [value.dtype.name, list(value.shape)] for key, value in outputs.items()}
    if "scores" in outputs:
        found[name]["sums"] = np.sum(outputs["scores"].numpy(), axis=-1).round(5).tolist()
        found[name]["in_range"] = bool(np.all((outputs["scores"].numpy() >= 0) & (outputs["scores"].numpy() <= 1)))
        found[name]["first_classes"] = [c.decode() for c in outputs["classes"].numpy()[0]]
print(json.dumps(found))
"""


def test_each_kind_of_output_gets_its_name_and_scores_are_probabilities():
    result = run_python(["-c", NAMED])
    assert result.returncode == 0, result.stderr[-3000:]
    found = json.loads(result.stdout.strip().splitlines()[-1])
    logits = found["logits"]
    assert logits["scores"] == ["float32", [4, 3]] and logits["classes"] == ["string", [4, 3]]
    assert logits["sums"] == [1.0] * 4 and logits["first_classes"] == ["cat", "dog", "owl"]  # a softmax applied
    multi_hot = found["multi-hot logits"]
    assert multi_hot["in_range"] and multi_hot["sums"] != [1.0] * 4  # a sigmoid per class, not a softmax
    assert multi_hot["first_classes"] == ["0", "1"]  # no names in the dataset: the indices as text
    assert set(found["one unit"]) == {"p"}  # not one score per class: under the model's own output name
    assert set(found["value"]) == {"outputs"}
    assert set(found["two outputs"]) == {"a", "b"}
