"""No traceback on any path: run directories and model files damaged in many ways, then `evaluate`, `fit` and
`devices` on each. Every run exits with a code of the README's table, prints no traceback, ends an error in one
line naming the file or setting (never "This is a bug"), and leaves the newest intact checkpoint loadable.

The damage is drawn from FUZZ_SEED (default 27; `FUZZ_SEED=$RANDOM make test-all` draws other offsets, bytes and
values); the cases are the same for every seed. They run in one process (tests/harness/fuzz.py), without root's
power over files where the tests run as root, so an unwritable file is unwritable.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
from pathlib import Path

import pytest

from tests.conftest import REPO, clean_env, copy_data_dir, run_python, run_train
from tests.harness.caps import can_drop_file_override
from tests.harness.fuzz_table import BEFORE_TENSORFLOW, NO_CHECKPOINT, expected
from train.errors import EXIT_OK, SettingsError
from train.model_file import load_model_file
from train.settings import FIELDS

pytestmark = [
    pytest.mark.slow,  # 135 cases, about 400 commands: 2 minutes of CPU
    pytest.mark.skipif(not can_drop_file_override(), reason="root here cannot drop CAP_DAC_OVERRIDE"),
    pytest.mark.timeout(1500),  # the first test's set-up trains the template and runs the driver (its own bound: 600 s)
]

SEED = int(os.environ.get("FUZZ_SEED", "27"))
ROOT = os.geteuid() == 0
OTHER_UID = 12345  # the owner of "another user's" files

# A small run: checkpoints 0, 2 and 4 kept, splits cut down so that a command that gets to TensorFlow is quick.
SETTINGS = {"MODEL": "model.py", "OUTPUT_DIR": "run", "BATCH_SIZE": 32, "EPOCHS": 1, "STEPS_PER_EPOCH": 4,
            "CHECKPOINT_EVERY": 2, "KEEP_CHECKPOINTS": 3, "LOG_EVERY": 1000, "JIT_COMPILE": "false",
            "TRAIN_SPLIT": "train[:256]", "EVAL_SPLIT": "test[:128]"}  # fmt: skip
NEWEST = 4
MODEL = """import keras


def build_model(input_shape, num_classes, learning_rate):
    model = keras.Sequential([keras.Input(input_shape), keras.layers.Dense(8, activation="relu"),
                              keras.layers.Dense(num_classes, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss="sparse_categorical_crossentropy",
                  metrics=["accuracy"])
    return model
"""
INTEGER_OUTPUT = """import keras


def build_model(input_shape, num_classes, learning_rate):
    inputs = keras.Input(input_shape)
    scores = keras.layers.Dense(num_classes, activation="softmax")(inputs)
    model = keras.Model(inputs, keras.ops.cast(scores * 100, "int32"))
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss="sparse_categorical_crossentropy")
    return model
"""

FILE_DAMAGE = ("truncated", "garbage", "wrong-json", "deleted", "a-folder", "unwritable", "unreadable", "another-user",
               "dangling-symlink")  # fmt: skip
FOLDER_DAMAGE = ("deleted", "a-file", "unwritable", "unreadable", "another-user", "dangling-symlink")
FILES = ("settings.json", "run.json", "epochs.json", "summary.json", ".lock", "model.keras", "checkpoints/checkpoint",
         f"checkpoints/ckpt-{NEWEST}.index", f"checkpoints/ckpt-{NEWEST}.data-00000-of-00001")  # fmt: skip
FOLDERS = (".", "checkpoints", "logs", "logs/train", "saved_model")
JSON = ("settings.json", "run.json", "epochs.json", "summary.json", ".lock")
LEFTOVERS = {
    "killed-save": f"checkpoints/ckpt-{NEWEST + 2}_temp",
    "unindexed-data": f"checkpoints/ckpt-{NEWEST + 2}.data-00000-of-00001",
}
WRONG_JSON = ([], 7, "text", None, True, [{"MODEL": "model.py"}], {"MODEL": 3}, {"BATCH_SIZE": ["32"]},
              {"model_sha256": 12}, {"jit_compile": "yes"}, {"precision": "float99"}, {"pid": "me"})  # fmt: skip
MODELS = {
    "cut": None,  # MODEL cut at a random offset
    "garbage-bytes": None,  # random bytes put in at a random offset
    "missing-import": "import not_a_module_anywhere\n" + MODEL,
    "wrong-signature": MODEL.replace("(input_shape, num_classes, learning_rate)", "(input_shape)"),
    "more-classes": MODEL.replace("Dense(num_classes,", "Dense(num_classes + {k},"),
    "one-output": MODEL.replace("Dense(num_classes,", "Dense(1,"),
    "extra-axis": MODEL.replace('activation="softmax")]', 'activation="softmax"), keras.layers.Reshape((-1, 1))]'),
    "integer-output": INTEGER_OUTPUT,
    "raises": MODEL.replace("    model = ", "    raise {error}('{message}')\n    model = "),
    "returns-none": MODEL.replace("    return model", "    return None"),
    "not-compiled": MODEL.replace("    model.compile(", "    dict("),
    "not-a-function": "build_model = 3\n",
    "raises-on-import": "raise RuntimeError('no licence server')\n" + MODEL,
    "tuple-hyperparameter": MODEL.replace("learning_rate):", "learning_rate, *, sizes=(8, 8)):"),
    "positional-context": MODEL.replace("learning_rate):", "learning_rate, context):"),
    "callbacks-raise": MODEL + "\n\ndef build_callbacks(context):\n    raise {error}('{message}')\n",
    "callbacks-not-a-list": MODEL + "\n\ndef build_callbacks(context):\n    return 7\n",
    "empty": "",
    "a-folder": None,
    "unreadable": MODEL,
    "dangling-symlink": None,
}

# The mistakes forkers make: each ends in one line naming the fix (exit 2 before the first step; exit 1 mid-run for
# what only running finds, the last checkpoint intact), never "This is a bug". Each is (MODEL, exit code, words of
# which the line names one (the fix), the issue whose engine change makes the case pass, None where it passes now).
SUBCLASSED = """import keras


class Classifier(keras.Model):
    def __init__(self, head):
        super().__init__()
        self.hidden = keras.layers.Dense(8, activation="relu")
        self.head = head

    def call(self, inputs):
        return self.head(self.hidden(inputs))


def build_model(input_shape, num_classes, learning_rate):
    model = Classifier(keras.layers.Dense(num_classes, activation="softmax"))
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss="sparse_categorical_crossentropy")
    return model
"""
PREPROCESS = """import tensorflow as tf


def preprocess(example, training, seed):
    return example["features"], example["label"]

"""
LOOKUP = PREPROCESS.replace(
    "def preprocess",
    """SIGN = tf.lookup.StaticHashTable(
    tf.lookup.KeyValueTensorInitializer(tf.constant([0, 1], tf.int64), tf.constant([-1.0, 1.0])), 0.0)


def preprocess""",
).replace(
    'return example["features"]',
    'return example["features"] * SIGN.lookup(tf.cast(example["features"][0] > 0, tf.int64))',
)
RAISES_ON_SOME = PREPROCESS.replace(
    "    return",
    """    tf.debugging.assert_less(example["label"], tf.constant(9, tf.int64), message="a label of 9 is not handled")
    return""",
)
IMAGE_FOLDER = """from pathlib import Path

import tensorflow as tf
import tensorflow_datasets as tfds

ROOT = Path(__file__).parent / "pictures"  # not the builder's name: DATASET="photos" is no folder in the cwd
for split, label, index in [(s, c, i) for s in ("train", "test") for c in ("cat", "dog") for i in range(4)]:
    path = ROOT / split / label / f"{index}.png"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(tf.io.encode_png(tf.fill((8, 8, 3), tf.constant(40 * index, tf.uint8))).numpy())


class Photos(tfds.ImageFolder):
    def __init__(self, **kwargs):
        super().__init__(root_dir=str(ROOT), shape=(8, 8, 3))
"""
IMAGE_MODEL = """import keras
import tensorflow as tf


def preprocess(example, training, seed):
    return tf.image.resize(tf.cast(example["image"], tf.float32) / 255, (8, 8)), example["label"]


def build_model(input_shape, num_classes, learning_rate):
    model = keras.Sequential([keras.Input(input_shape), keras.layers.Flatten(),
                              keras.layers.Dense(num_classes, activation="softmax")])
    model.compile(optimizer=keras.optimizers.Adam(learning_rate), loss="sparse_categorical_crossentropy")
    return model
"""
NON_DICT_STEP = MODEL.replace("    model = keras.Sequential([", "    model = Stepped([").replace(
    "import keras\n",
    """import keras


class Stepped(keras.Sequential):
    def train_step(self, data):
        inputs, labels = data
        return self.compute_loss(x=inputs, y=labels, y_pred=self(inputs, training=True))
""",
)
MISTAKES = {
    "no-get-config": (SUBCLASSED, 2, ("get_config",), None),  # issue 31 fixed it
    "lookup-table-in-preprocess": (LOOKUP + MODEL, 0, (), None),  # no mistake since issue 31: it trains and exports
    # a registered tfds.ImageFolder opened by its name trains on its folder written once (run.json's kind "tfds")
    "image-folder-builder": (IMAGE_MODEL, 0, (), None),
    "train-step-not-a-dict": (NON_DICT_STEP, 2, ("train_step",), None),  # issue 32 fixed it
    "preprocess-raises-on-some-examples": (RAISES_ON_SOME + MODEL, 1, ("preprocess",), None),
}
MISTAKE_SETTINGS = {
    "image-folder-builder": {"DATASET": "photos", "TRAIN_SPLIT": "train", "EVAL_SPLIT": "test", "BATCH_SIZE": 4}
}
MISTAKE_DATASETS = {"image-folder-builder": IMAGE_FOLDER}  # the fork's project/datasets module, imported first

CASES = (
    [f"{target}:{kind}" for target in FILES for kind in FILE_DAMAGE if kind != "wrong-json" or target in JSON]
    + [f"{target}/:{kind}" for target in FOLDERS for kind in FOLDER_DAMAGE]
    + [f"leftover:{kind}" for kind in LEFTOVERS]
    + [f"model:{kind}" for kind in MODELS]
)


def damage_file(path: Path, kind: str, rng: random.Random) -> None:
    if kind == "truncated":
        data = path.read_bytes()
        path.write_bytes(data[: rng.randrange(len(data))] if data else b"")
    elif kind == "garbage":
        path.write_bytes(rng.randbytes(rng.randint(1, 300)))
    elif kind == "wrong-json":
        path.write_text(json.dumps(rng.choice(WRONG_JSON)))
    elif kind in ("deleted", "a-folder", "dangling-symlink"):
        path.unlink()
        if kind == "a-folder":
            path.mkdir()
            (path / "inside").write_text("x")
        elif kind == "dangling-symlink":
            path.symlink_to(path.parent / "nowhere" / path.name)
    else:
        take_away(path, kind)


def take_away(path: Path, kind: str) -> None:
    """unwritable, unreadable, another-user: what a user without root's power over files meets."""
    folder = path.is_dir()
    if kind == "unwritable":
        path.chmod(0o555 if folder else 0o444)
    elif kind == "unreadable":
        path.chmod(0o000)
    elif ROOT:  # another-user: theirs, readable by all
        for each in [path, *path.rglob("*")] if folder else [path]:
            os.chown(each, OTHER_UID, OTHER_UID, follow_symlinks=False)
    else:
        path.chmod(0o555 if folder else 0o444)


def damage_folder(path: Path, kind: str) -> None:
    if kind in ("deleted", "a-file", "dangling-symlink"):
        shutil.rmtree(path)
        if kind == "a-file":
            path.write_text("x")
        elif kind == "dangling-symlink":
            path.symlink_to(path.parent / "nowhere")
    else:
        take_away(path, kind)


def damage_model(path: Path, kind: str, rng: random.Random) -> str:
    """Writes the damaged MODEL file; returns the error class a raising case raises ("" for the others)."""
    text = MODELS[kind]
    if kind == "cut":
        path.write_text(MODEL[: rng.randrange(1, len(MODEL))])
    elif kind == "garbage-bytes":
        at = rng.randrange(len(MODEL))
        path.write_bytes(MODEL[:at].encode() + rng.randbytes(rng.randint(1, 16)) + MODEL[at:].encode())
    elif kind == "a-folder":
        path.mkdir()
    elif kind == "dangling-symlink":
        path.symlink_to(path.parent / "nowhere.py")
    else:
        error = rng.choice(["RuntimeError", "KeyError", "ValueError", "MemoryError", "ImportError"])
        path.write_text(text.format(k=rng.randint(1, 50), error=error, message="no GPU budget today"))
        if kind == "unreadable":
            path.chmod(0o000)
        return error if "{error}" in text else ""
    return ""


def make_case(name: str, template: Path, folder: Path) -> dict:
    """The case's folder (a copy of the template run, damaged), its settings and its newest intact checkpoint."""
    rng = random.Random(f"{SEED}:{name}")
    target, kind = name.rsplit(":", 1)
    shutil.copytree(template, folder, symlinks=True)
    run, intact, error = folder / "run", NEWEST, ""
    settings = {**SETTINGS, "OUTPUT_DIR": str(run)}
    if target == "model":
        (folder / "model.py").unlink()
        error = damage_model(folder / "model.py", kind, rng)
        settings["OUTPUT_DIR"], intact = str(folder / "new-run"), None  # a new run: its model is built
    elif target == "leftover":
        leftover = run / LEFTOVERS[kind]
        if kind == "killed-save":
            leftover.mkdir()
            leftover = leftover / "part-00000-of-00001.data-00000-of-00001"
        leftover.write_bytes(rng.randbytes(4096))
    elif target.endswith("/"):
        damage_folder(run / target[:-1], kind)
        gone = kind in ("deleted", "a-file", "dangling-symlink") and target in ("./", "checkpoints/")
        intact = None if gone else intact
    else:
        damage_file(run / target, kind, rng)
        readable = kind in ("unwritable", "another-user")
        intact = NEWEST - 2 if target.startswith(f"checkpoints/ckpt-{NEWEST}.") and not readable else intact
    env = {name: str(value) for name, value in settings.items()}
    return {"name": name, "dir": str(folder), "env": env, "intact": intact, "error": error,
            "commands": [["evaluate"], ["fit"], ["devices"]]}  # fmt: skip


def make_mistake(name: str, folder: Path) -> dict:
    """A new run of a MODEL file with a forker's mistake: its checkpoint 0 must stay loadable where it gets that far."""
    folder.mkdir()
    (folder / "model.py").write_text(MISTAKES[name][0])
    # MODEL by its absolute path: the driver runs every case in one process, where a MODEL is loaded once per name
    settings = {**SETTINGS, "MODEL": str(folder / "model.py"), "OUTPUT_DIR": str(folder / "run"),
                **MISTAKE_SETTINGS.get(name, {})}  # fmt: skip
    intact = 0 if MISTAKES[name][1] == 1 else None  # mid-run: the checkpoints saved before stay
    case = {"name": f"mistake:{name}", "dir": str(folder), "env": {k: str(v) for k, v in settings.items()},
            "intact": intact, "commands": [["fit"]]}  # fmt: skip
    if name in MISTAKE_DATASETS:
        (folder / "datasets.py").write_text(MISTAKE_DATASETS[name])
        case["datasets"] = str(folder / "datasets.py")
    return case


@pytest.fixture(scope="module")
def results(tmp_path_factory, tfds_data_dir) -> dict:
    """Every case's runs, from one driver process."""
    base = tmp_path_factory.mktemp("fuzz")
    template = base / "template"
    template.mkdir()
    (template / "model.py").write_text(MODEL)
    data_dir = base / "tfds"  # a private copy: the image-folder-builder case writes its folder's copy beside
    copy_data_dir(tfds_data_dir, data_dir)  # synthetic_clusters, where the session's other tests would see it
    trained = run_train("fit", cwd=template, TFDS_DATA_DIR=data_dir, **SETTINGS)
    assert trained.returncode == 0, trained.stderr[-3000:]
    cases = [make_case(name, template, base / f"case{index}") for index, name in enumerate(CASES)]
    cases += [make_mistake(name, base / f"mistake{index}") for index, name in enumerate(MISTAKES)]
    (base / "cases.json").write_text(json.dumps(cases))
    driven = run_python(["-m", "tests.harness.fuzz", str(base / "cases.json"), str(base / "results.json")],
                        cwd=base, env=clean_env(TFDS_DATA_DIR=data_dir), timeout=600)  # fmt: skip
    assert driven.returncode == 0, driven.stderr[-5000:]
    assert "Traceback" not in driven.stderr, driven.stderr[-5000:]
    return {case["name"]: {**case, **json.loads((base / "results.json").read_text())[case["name"]]} for case in cases}


TABLE = (REPO / "README.md").read_text().split("## Exit codes", 1)[1].split("\n## ", 1)[0]
EXIT_CODES = {int(code) for code in re.findall(r"^\| (\d+) \|", TABLE, flags=re.MULTILINE)}
SETTING_NAMES = tuple(field.env for field in FIELDS)


@pytest.mark.parametrize("name", CASES)
def test_every_command_ends_in_a_documented_code_without_a_traceback_and_keeps_the_checkpoints(results, name):
    case = results[name]
    for run in case["runs"]:
        said = (
            f"{' '.join(run['args'])} on {name}: exit {run['exit']}\n{run['stdout'][-1500:]}\n{run['stderr'][-3000:]}"
        )
        assert run["exception"] is None, said + run["exception"]
        assert run["exit"] in EXIT_CODES, said
        assert "Traceback" not in run["stdout"] + run["stderr"], said
        assert "This is a bug" not in run["stderr"], said
        if run["exit"] != EXIT_OK:
            last = run["stderr"].strip().splitlines()[-1] if run["stderr"].strip() else ""
            assert last.startswith("error: "), said
            assert case["dir"] in last or any(f"{setting}=" in last for setting in SETTING_NAMES), said
        code, line = expected(name, Path(case["dir"]) / "model.py", MODEL).get(run["args"][0], (EXIT_OK, None))
        assert run["exit"] == code, said
        if line is not None:
            target = re.escape(name.rsplit(":", 1)[0].rstrip("/"))
            fields = {"run": re.escape(f"{case['dir']}/run"), "dir": re.escape(case["dir"]), "target": target,
                      "error": case.get("error", "")}  # fmt: skip
            pattern = line.format(**fields) if "{" in line else line
            assert re.search(pattern, last), f"{said}\nexpected a line matching {pattern}"
            before = name in BEFORE_TENSORFLOW or (not name.startswith("model:") and line is not NO_CHECKPOINT[1])
            if before:  # refused before TensorFlow loads
                assert not run["tensorflow"], said
    if case["intact"] is not None:
        assert case["loaded"] is not None and case["loaded"] >= case["intact"], (name, case["loaded"])


@pytest.mark.parametrize(
    "name",
    [pytest.param(name, marks=[pytest.mark.xfail(strict=True, reason=f"fixed by {fixed}")] if fixed else [])
     for name, (_, _, _, fixed) in MISTAKES.items()],
)  # fmt: skip
def test_a_forkers_mistake_ends_in_one_line_naming_the_fix_never_as_a_bug(results, name):
    _, code, fix, _ = MISTAKES[name]
    case = results[f"mistake:{name}"]
    (run,) = case["runs"]
    said = f"fit on {name}: exit {run['exit']}\n{run['stdout'][-1500:]}\n{run['stderr'][-3000:]}"
    assert run["exception"] is None, said + run["exception"]
    assert "Traceback" not in run["stdout"] + run["stderr"] and "This is a bug" not in run["stderr"], said
    assert run["exit"] == code, said
    if code != 0:
        last = run["stderr"].strip().splitlines()[-1]
        assert last.startswith("error: ") and any(word in last for word in fix), said
    if case["intact"] is not None:  # stopped mid-run: what was saved before still loads
        assert case["loaded"] is not None and case["loaded"] >= case["intact"], (name, case["loaded"])
    if name == "image-folder-builder":  # opened by its registered name, not read as a folder of images
        data = json.loads((Path(case["dir"]) / "run" / "run.json").read_text())["data"]
        assert (data["kind"], data["name"]) == ("tfds", "photos"), data


def test_a_model_file_replaced_at_the_same_path_in_one_process_is_imported_again(tmp_path):
    """The MODEL file's cache is keyed by its resolved path and its content: no stale module (no TensorFlow here)."""
    path = tmp_path / "model.py"
    path.write_text("def build_model(input_shape, num_classes, learning_rate):\n    return 'first'\n")
    assert load_model_file(str(path)).build_model((2,), 2, 0.1) == "first"
    assert load_model_file(str(path)).module is load_model_file(str(path)).module  # one import per version
    path.write_text("build_model = 3\n")
    with pytest.raises(SettingsError, match=r"has no build_model"):
        load_model_file(str(path))
    path.write_text("def build_model(input_shape, num_classes, learning_rate):\n    return 'second'\n")
    assert load_model_file(str(path)).build_model((2,), 2, 0.1) == "second"


def test_the_fuzz_driver_refuses_a_damaged_model_after_a_good_one_at_the_same_path(tmp_path, tfds_data_dir):
    """The driver's isolation: two cases in one process, one folder, MODEL=model.py in both; the first has the
    good template (a new run: evaluate finds no checkpoint), the second the same path rewritten to return None."""
    env = {name: str(value) for name, value in {**SETTINGS, "OUTPUT_DIR": str(tmp_path / "run")}.items()}
    model, texts = str(tmp_path / "model.py"), {"good": MODEL, "damaged": MODELS["returns-none"]}
    cases = [{"name": name, "dir": str(tmp_path), "env": env, "intact": None, "commands": [["evaluate"]],
              "write": {model: text}} for name, text in texts.items()]  # fmt: skip
    (tmp_path / "cases.json").write_text(json.dumps(cases))
    driven = run_python(["-m", "tests.harness.fuzz", str(tmp_path / "cases.json"), str(tmp_path / "results.json")],
                        cwd=tmp_path, env=clean_env(TFDS_DATA_DIR=tfds_data_dir), timeout=300)  # fmt: skip
    assert driven.returncode == 0, driven.stderr[-5000:]
    results = json.loads((tmp_path / "results.json").read_text())
    (good,), (damaged,) = results["good"]["runs"], results["damaged"]["runs"]
    assert good["exit"] == 2 and "has no checkpoint: run fit first" in good["stderr"], good["stderr"][-2000:]
    assert damaged["exit"] == 2, damaged["stderr"][-2000:]
    assert "build_model returned NoneType, not a keras.Model" in damaged["stderr"].strip().splitlines()[-1]
